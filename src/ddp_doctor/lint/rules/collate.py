"""DDP104 collate-may-return-none: a collate_fn with a path that returns None."""
from __future__ import annotations

import ast

from ddp_doctor.lint.names import final_name
from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.rules.loader_facts import all_calls, dl_arg


class CollateMayReturnNone(Rule):
    code = "DDP104"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        fns: dict[ast.AST, None] = {}
        for call, scope in all_calls(m, m.is_dataloader_call):
            cf = dl_arg(call, "collate_fn")
            if cf is None:
                continue
            if isinstance(cf, ast.Call) and final_name(cf.func) == "partial" and cf.args:
                cf = cf.args[0]
            fn = m.resolve_function(cf, scope)
            if fn is None and isinstance(cf, ast.Name):
                cls = m.classes.get(cf.id)
                fn = m.methods.get(cls, {}).get("__call__") if cls is not None else None
            if fn is None and isinstance(cf, ast.Call):
                cls = m.classes.get(final_name(cf.func) or "")
                fn = m.methods.get(cls, {}).get("__call__") if cls is not None else None
            if fn is not None:
                fns[fn] = None
        for name, defs in m.functions.items():
            if name == "collate_fn":
                for d in defs:
                    fns[d] = None
        for fn in fns:
            rets = m.returns_of(fn)
            if any(r.value is not None for r in rets) and _falls_through(fn.body):
                last = fn.body[-1]
                ctx.report(
                    self.code, last,
                    f"collate function `{fn.name}` can run past its last statement and return None (it only "
                    f"returns a batch on some paths): the training loop then gets a None batch on this rank "
                    f"only. Skipping it makes ranks run different numbers of steps (hang); not skipping it "
                    f"crashes the rank.",
                    "Return a valid batch on every path (re-sample or pad), or raise a clear error.",
                )
            for node in rets:
                if (node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None)):
                    ctx.report(
                        self.code, node,
                        f"collate function `{fn.name}` returns None here: the training loop then gets a None "
                        f"batch on this rank only. Skipping it with `continue` makes ranks run different numbers "
                        f"of steps (hang); not skipping it crashes the rank.",
                        "Never return None from a collate_fn: re-sample or pad to a valid batch (or return an "
                        "empty batch and skip it on every rank together with `ddp_doctor.fixes.agree`).",
                    )


def _falls_through(body: list[ast.stmt]) -> bool:
    """Can execution run off the end of ``body`` (an implicit ``return None``)?"""
    if not body:
        return True
    last = body[-1]
    if isinstance(last, (ast.Return, ast.Raise)):
        return False
    if isinstance(last, ast.If):
        return _falls_through(last.body) or _falls_through(last.orelse)
    if isinstance(last, (ast.With, ast.AsyncWith)):
        return _falls_through(last.body)
    if isinstance(last, ast.While) and isinstance(last.test, ast.Constant) and last.test.value is True:
        return False
    if isinstance(last, ast.Try):
        if last.finalbody and not _falls_through(last.finalbody):
            return False
        return _falls_through(last.body + last.orelse) or any(_falls_through(h.body) for h in last.handlers)
    if isinstance(last, ast.Match):
        return True
    return True
