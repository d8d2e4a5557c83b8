"""Pure readings of a piece of syntax that lint's shared analysis asks (no model of the module needed): a
container literal's item, the off-by-default flag a call site runs under, whether a call switches it on."""
from __future__ import annotations

import ast

from ddp_doctor.lint.names import final_name


def dict_items(v: ast.expr, key) -> list[ast.expr]:
    """The item ``key`` of a dict literal, ``dict(...)``, or a list / tuple literal (``loaders[0]``)."""
    if isinstance(v, (ast.List, ast.Tuple)) and type(key) is int and -len(v.elts) <= key < len(v.elts) and \
            not any(isinstance(e, ast.Starred) for e in v.elts):
        return [v.elts[key]]
    if isinstance(v, ast.Dict):
        return [val for k, val in zip(v.keys, v.values) if isinstance(k, ast.Constant) and k.value == key]
    if isinstance(v, ast.Call) and final_name(v.func) == "dict":
        return [kw.value for kw in v.keywords if kw.arg == key]
    return []


def flag_guard(fn: ast.AST, conds) -> str | None:
    """The parameter, off by default (``=False`` / ``None`` / ``0``), that a site runs under (``if flag:``)."""
    a = getattr(fn, "args", None)
    if a is None:
        return None
    pos = [*a.posonlyargs, *a.args]
    off = {x.arg for x, d in [*zip(pos[len(pos) - len(a.defaults):], a.defaults), *zip(a.kwonlyargs, a.kw_defaults)]
           if isinstance(d, ast.Constant) and not d.value}
    return next((c.test.id for c in conds if c.positive and isinstance(c.test, ast.Name) and c.test.id in off), None)


def passes_flag(call: ast.Call, params: tuple[str, ...], flag: str) -> bool:
    """Does ``call`` switch ``flag`` on (pass it, other than as a false constant; ``**kw`` may)?
    ``params``: the callee's positional parameters without self/cls."""
    def on(v: ast.expr) -> bool:
        return not (isinstance(v, ast.Constant) and not v.value)

    for k in call.keywords:
        if k.arg == flag or k.arg is None:
            return on(k.value)
    if any(isinstance(x, ast.Starred) for x in call.args):
        return True
    return flag in params and params.index(flag) < len(call.args) and on(call.args[params.index(flag)])
