"""Where a DDP model's parameters went without a gradient on some ranks: the branch of the model's own
``forward`` (an ``if`` or a conditional expression) whose one arm alone uses the module holding them.

DDP's "Expected to have finished reduction" error names the parameters (``errors.diagnose_unused``); this
finds the decision behind it in the source: the DDP(...) call the probe recorded gives the model's class, that
class's ``forward`` gives the branch.  Reads the user's files (``source``), never runs them."""
from __future__ import annotations

import ast

from ddp_doctor.evidence import DdpParam, RankState, Site
from ddp_doctor.diagnose.decision import Decision
from ddp_doctor.diagnose.source import function_at, parse_file, source_of


def _model_class(site: Site) -> str | None:
    """The class name of the model wrapped by the DDP(...) call at ``site``: ``DDP(Net())``, or
    ``DDP(net)`` with ``net = Net(...)`` assigned before in the same function."""
    parsed = parse_file(site.path)
    if parsed is None:
        return None
    tree = parsed[0]
    call = next((n for n in ast.walk(tree) if isinstance(n, ast.Call) and n.lineno <= site.line
                 <= (n.end_lineno or n.lineno) and n.args), None)
    arg = call.args[0] if call is not None else None
    if isinstance(arg, ast.Name):
        fn = function_at(tree, site.function, site.line)
        assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and n.lineno < site.line
                   and any(isinstance(t, ast.Name) and t.id == arg.id for t in n.targets)]
        arg = max(assigns, key=lambda n: n.lineno).value if assigns else None
        if isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "to":
            arg = arg.func.value  # Net().to(device)
    if isinstance(arg, ast.Call):
        f = arg.func
        return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
    return None


def _forward(cls: str, files: list[str]) -> tuple[str, ast.AST, tuple[str, ...]] | None:
    for path in files:
        parsed = parse_file(path)
        if parsed is None:
            continue
        for node in ast.walk(parsed[0]):
            if isinstance(node, ast.ClassDef) and node.name == cls:
                fwd = next((b for b in node.body if isinstance(b, ast.FunctionDef) and b.name == "forward"), None)
                if fwd is not None:
                    return path, fwd, parsed[1]
    return None


def _uses(nodes, attr: str) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == attr and isinstance(n.value, ast.Name)
               and n.value.id == "self" for x in nodes for n in ast.walk(x))


def unused_branch(ddp_site: Site | None, params: list[DdpParam], culprits: list[int],
                  ranks: dict[int, RankState]) -> Decision | None:
    """The branch of the model's forward whose one arm alone uses the module of the parameters ``culprits``
    left without a gradient."""
    top = sorted({p.module.split(".")[0] for p in params if p.module})
    cls = _model_class(ddp_site) if ddp_site is not None and len(top) == 1 else None
    if cls is None:
        return None
    files = [ddp_site.path] + sorted({f.path for st in ranks.values() for f in st.stack if f.path != ddp_site.path})
    found = _forward(cls, files)
    if found is None:
        return None
    path, fwd, lines = found
    for node in sorted(ast.walk(fwd), key=lambda n: getattr(n, "lineno", 0)):
        if not isinstance(node, (ast.If, ast.IfExp)):
            continue
        body = node.body if isinstance(node, ast.If) else [node.body]
        orelse = node.orelse if isinstance(node, ast.If) else [node.orelse]
        if _uses(body, top[0]) != _uses(orelse, top[0]):
            arm = "its `if` arm" if _uses(body, top[0]) else "its `else` arm"
            who = ", ".join(map(str, culprits))
            ways = tuple((r, f"left `self.{top[0]}` without a gradient") for r in culprits)
            why = (f"Only {arm} calls `self.{top[0]}`, so its parameters get a gradient only in the iterations "
                   f"where `{source_of(node.test, lines)}` takes that way; on rank {who} it did not (DDP raised "
                   "there).")
            return Decision(Site(path, node.lineno, "forward"), "if", source_of(node.test, lines), ways, (), why,
                            culprits=tuple(culprits))
    return None
