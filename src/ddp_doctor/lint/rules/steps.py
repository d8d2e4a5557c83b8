"""DDP101: a data-, loss- or rank-dependent continue/break/return in a DDP training loop."""
from __future__ import annotations

import ast

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import AGREE_FUNCS, INPLACE_COLLECTIVES, ModuleModel, Scope, dotted, final_name
from ddp_doctor.lint.rules.base import Context, Rule

_SIZE_ATTRS = {"shape", "size", "numel", "__len__"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _has_collective(m: ModuleModel, node: ast.AST, scope: Scope) -> bool:
    for c in ast.walk(node):
        if isinstance(c, ast.Call):
            if m.collective_name(c, scope) or final_name(c.func) in AGREE_FUNCS or \
                    final_name(c.func) in ("skip_if_nonfinite",):
                return True
            fn = m.resolve_function(c.func, scope)
            if fn is not None and A.fn_collectives(m, fn):
                return True
    return False


def _loop_data_names(loop: ast.stmt) -> set[str]:
    """Names bound to the *data* of a for loop (not ``enumerate``'s counter, not ``range``)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return set()
    it = loop.iter
    if isinstance(it, ast.Call) and final_name(it.func) in ("range", "trange"):
        return set()
    target = loop.target
    if isinstance(it, ast.Call) and final_name(it.func) == "enumerate" and isinstance(target, (ast.Tuple, ast.List)) \
            and target.elts:
        target = ast.Tuple(elts=target.elts[1:])
    return _names(target)


def tainted_names(m: ModuleModel, scope: Scope) -> set[str]:
    """Names whose value can differ between ranks because it comes from the rank's own data or loss."""
    key = ("taint", scope.node)
    if key in m._cache:
        return m._cache[key]
    tainted: set[str] = set()
    for loop, _c, _l in scope.loops:
        tainted |= _loop_data_names(loop)
    agreed: set[str] = set()
    for site in scope.sites:
        name = m.collective_name(site.call, scope)
        if name and name.split(".")[-1] in INPLACE_COLLECTIVES and site.call.args:
            d = dotted(site.call.args[0])
            if d:
                agreed.add(d.split(".")[0])
    # results of the DDP model, of next(iterator) and of same-file helpers fed with data
    changed = True
    rounds = 0
    while changed and rounds < 6:
        changed = False
        rounds += 1
        for name, vals in scope.assigns.items():
            if name in tainted or name in agreed or "." in name:
                continue
            for value, conds in vals:
                if _value_tainted(m, scope, value, tainted) or any(
                        _names(c.test) & tainted and not _has_collective(m, c.test, scope) for c in conds):
                    tainted.add(name)
                    changed = True
                    break
    tainted -= agreed
    m._cache[key] = tainted
    return tainted


def _value_tainted(m: ModuleModel, scope: Scope, value: ast.expr, tainted: set[str]) -> bool:
    if _has_collective(m, value, scope):
        return False
    if _names(value) & tainted:
        return True
    for c in ast.walk(value):
        if isinstance(c, ast.Call):
            if final_name(c.func) == "next":
                return True
            tgt = A.forward_target(c)
            if tgt is not None:
                if isinstance(tgt, ast.Attribute) and tgt.attr == "module":
                    tgt = tgt.value  # model.module(x): the rank's own forward, too
                if m.is_ddp_value(tgt, scope):
                    return True
    # a value computed from the rank itself (x[rank::world], rank-local validation shards)
    return m.mentions_rank(value, scope) and not isinstance(value, (ast.Constant,))


def _size_only(test: ast.expr, tainted: set[str]) -> bool:
    """``x.size(0) != args.batch_size``: a batch-size test, the same on every rank (not a filter)."""
    for n in ast.walk(test):
        if isinstance(n, ast.Compare):
            for side in (n.left, *n.comparators):
                if isinstance(side, ast.Constant) and side.value in (0, None) and not isinstance(side.value, bool):
                    return False  # `len(batch) == 0`: an emptied (filtered) batch, not a size test
    if isinstance(test, ast.UnaryOp):
        return False
    ok = False
    parents = {}
    for n in ast.walk(test):
        for ch in ast.iter_child_nodes(n):
            parents[ch] = n
    for n in ast.walk(test):
        if isinstance(n, ast.Name) and n.id in tainted:
            p, wrapped = parents.get(n), False
            cur = n
            while p is not None:
                if isinstance(p, ast.Attribute) and p.attr in _SIZE_ATTRS:
                    wrapped = True
                    break
                if isinstance(p, ast.Call) and final_name(p.func) == "len" and cur in p.args:
                    wrapped = True
                    break
                cur, p = p, parents.get(p)
            if not wrapped:
                return False
            ok = True
    return ok


def _encloses(container: ast.AST, node: ast.AST) -> bool:
    return container.lineno <= node.lineno <= (container.end_lineno or container.lineno)


class UnevenSteps(Rule):
    code = "DDP101"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.uses_ddp:
            return
        for scope in m.scopes.values():
            loops = A.training_loops(m, scope)
            if not loops:
                continue
            tainted = tainted_names(m, scope)
            bws = A.backward_sites(m, scope)
            for jump in scope.jumps:
                if jump.kind == "raise":
                    continue
                for loop in loops:
                    if loop not in jump.loops:
                        continue
                    level = jump.loops.index(loop)
                    if jump.kind in ("continue", "break") and jump.loops[-1] is not loop:
                        continue
                    if jump.kind == "continue" and not any(
                            loop in s.loops and s.call.lineno > jump.stmt.lineno for s in bws):
                        continue  # a continue after the backward does not change the number of steps
                    conds = [c for c in jump.conds if c.loop_level > level and _encloses(c.node, jump.stmt)]
                    reason = self._reason(ctx, scope, conds, tainted)
                    if reason is None:
                        continue
                    word = {"continue": "`continue`", "break": "`break`", "return": "`return`",
                            "exit": "exit"}[jump.kind]
                    effect = ("skips this step's backward" if jump.kind == "continue"
                              else "leaves the training loop")
                    ctx.report(
                        self.code, jump.stmt,
                        f"{word} under `{reason}` {effect} on this rank only: {self._why(reason)} The other "
                        f"ranks still call DDP's gradient all-reduce and wait for it forever (a silent hang), "
                        f"or on gloo average gradients of different steps and fail later.",
                        "Make every rank take the same decision: `if ddp_doctor.fixes.agree(cond, op=\"any\"): "
                        "continue` (for a NaN/Inf loss: `ddp_doctor.fixes.skip_if_nonfinite`); for per-rank "
                        "data of different lengths wrap the loader in `ddp_doctor.fixes.EvenBatches`.",
                    )
                    break

    def _reason(self, ctx: Context, scope: Scope, conds, tainted: set[str]) -> str | None:
        m = ctx.model
        for c in reversed(conds):
            t = ctx.text(c.test, 50)
            text = t if c.positive else f"not ({t})"
            if m.is_rank_condition(c.test, scope):
                return text
            if _has_collective(m, c.test, scope):
                continue
            hit = _names(c.test) & tainted
            if hit and not _size_only(c.test, tainted):
                return text
        return None

    @staticmethod
    def _why(reason: str) -> str:
        return f"whether `{reason}` holds depends on this rank's own batch, loss or rank, not on a value " \
               f"all ranks agree on."
