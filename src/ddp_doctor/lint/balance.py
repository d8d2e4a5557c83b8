"""Balance of rank conditions: do all ranks enter a group of calls the same number of times, does a
condition say "not distributed" (``local_rank == -1``), is a branch dead on every rank.  Shared by
the rules that ask whether code runs on some ranks only."""
from __future__ import annotations

import ast
from typing import Iterable

from ddp_doctor.lint.evaluate import NODE_SIZE, RANKS
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import const_value
from ddp_doctor.lint.scopes import Cond, Scope


def cond_truths(model: ModuleModel, cond: Cond, scope: Scope, sigma: dict) -> list[str] | None:
    t = model.rank_truths(cond.test, scope, sigma)
    if t is None:
        return None
    if not cond.positive:
        t = ["F" if x == "T" else "T" if x == "F" else "?" for x in t]
    return t


def site_truths(model: ModuleModel, conds: Iterable[Cond], scope: Scope, sigma: dict) -> list[str] | None:
    res = ["T"] * len(RANKS)
    for c in conds:
        t = cond_truths(model, c, scope, sigma)
        if t is None:
            return None
        for r, x in enumerate(t):
            if res[r] == "F" or x == "F":
                res[r] = "F"
            elif x == "?":
                res[r] = "?"
    return res


def _unknowns(model: ModuleModel, group: list[tuple[tuple[Cond, ...], Scope]]) -> list[str]:
    """The unknowns (atoms) the conditions of ``group`` depend on, in first-seen order."""
    atoms: list[str] = []
    for conds, scope in group:
        for c in conds:
            for a in model.atoms(c.test, scope):
                if a not in atoms:
                    atoms.append(a)
    return atoms


def balanced(model: ModuleModel, group: list[tuple[tuple[Cond, ...], Scope]]) -> bool:
    """Do all ranks enter the same number of this group's calls, for every value of the unknowns?"""
    atoms = _unknowns(model, group)
    if len(atoms) > 4:
        return False
    evaluated = False
    exprs = [c.test for conds, _s in group for c in conds]
    for sigma in model.sigmas(atoms, exprs) if atoms else [{}]:
        lo = [0] * len(RANKS)
        hi = [0] * len(RANKS)
        ok = True
        for conds, scope in group:
            t = site_truths(model, conds, scope, sigma)
            if t is None:
                ok = False
                break
            for r, x in enumerate(t):
                lo[r] += x == "T"
                hi[r] += x != "F"
        if not ok:
            continue
        evaluated = True
        if len(set(lo)) > 1 or len(set(hi)) > 1:
            return False
    return evaluated


def _negative_const(node: ast.AST) -> bool:
    v = const_value(node)
    return type(v) is int and v < 0


def _is_rank_value(model: ModuleModel, expr: ast.expr, scope: Scope) -> bool:
    """``RANK``, ``args.local_rank``, ``int(os.environ["LOCAL_RANK"])``: the rank itself (not ``rank % 8``)."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Name) and expr.func.id == "int" and \
            len(expr.args) == 1:
        expr = expr.args[0]
    if not isinstance(expr, (ast.Name, ast.Attribute, ast.Call, ast.Subscript)):
        return False
    return model.mentions_rank(expr, scope)


def _says_single_process(model: ModuleModel, test: ast.expr, positive: bool, scope: Scope) -> bool:
    """Holding ``test`` (or its negation) implies ``rank == -1`` (or another negative rank): the
    "not distributed" convention of torchrun-era scripts (``LOCAL_RANK`` defaults to -1)."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _says_single_process(model, test.operand, not positive, scope)
    if isinstance(test, ast.BoolOp):
        # a conjunction holds only if each conjunct holds; a disjunction fails only if each disjunct fails
        if isinstance(test.op, ast.And) and positive or isinstance(test.op, ast.Or) and not positive:
            return any(_says_single_process(model, v, positive, scope) for v in test.values)
        return all(_says_single_process(model, v, positive, scope) for v in test.values)
    if not isinstance(test, ast.Compare) or len(test.ops) != 1:
        return False
    left, op, right = test.left, test.ops[0], test.comparators[0]
    if _negative_const(left) and isinstance(op, (ast.Eq, ast.NotEq)):
        left, right = right, left
    if positive:
        eq, within = (ast.Eq, ast.Is), ast.In
    else:
        eq, within = (ast.NotEq, ast.IsNot), ast.NotIn
    if isinstance(op, eq):
        hit = _negative_const(right)
    elif isinstance(op, within):
        hit = isinstance(right, (ast.List, ast.Tuple, ast.Set)) and bool(right.elts) and \
            all(_negative_const(e) for e in right.elts)
    elif positive and isinstance(op, ast.Lt):
        hit = const_value(right) == 0 or _negative_const(right)
    elif not positive and isinstance(op, ast.GtE):
        hit = const_value(right) == 0
    else:
        hit = False
    return hit and _is_rank_value(model, left, scope)


def single_process_only(model: ModuleModel, conds: Iterable[Cond], scope: Scope) -> bool:
    """One of the conditions says "not distributed" (``local_rank == -1``, ``RANK == -1 and ...``,
    ``not (args.local_rank != -1)``, the else branch of ``if rank != -1:``): under torchrun /
    mp.spawn every rank is >= 0, so the code never runs in a DDP job.  Shared by every rule that
    asks whether code runs on some ranks only."""
    for c in conds:
        key = ("single", id(c.test), c.positive, id(scope))
        got = model._cache.get(key)
        if got is None:
            got = model._cache[key] = _says_single_process(model, c.test, c.positive, scope)
        if got:
            return True
    return False


def never_runs(model: ModuleModel, conds: tuple[Cond, ...], scope: Scope) -> bool:
    """The conditions are False on every rank whatever the unknowns (dead code in a distributed run)."""
    if not conds:
        return False
    if single_process_only(model, conds, scope):
        return True
    atoms = _unknowns(model, [(conds, scope)])
    if len(atoms) > 4:
        return False
    for sigma in model.sigmas(atoms, [c.test for c in conds]) if atoms else [{}]:
        t = site_truths(model, conds, scope, sigma)
        if t is None or any(x != "F" for x in t):
            return False
    return True


def once_per_node(model: ModuleModel, conds: tuple[Cond, ...], scope: Scope) -> bool:
    """The conditions hold on the first rank of every node and on no other (``local_rank == 0``,
    ``is_local_main_process``): one process per node, which is not one per job when there are several
    nodes.  Shown for every value tried for the unknowns."""
    rconds = [c for c in conds if model.mentions_rank(c.test, scope)]
    if not rconds:
        return False
    atoms = _unknowns(model, [(tuple(rconds), scope)])
    if len(atoms) > 4:
        return False
    shown = False
    for sigma in model.sigmas(atoms, [c.test for c in rconds]) if atoms else [{}]:
        t = site_truths(model, rconds, scope, sigma)
        if t is None:
            continue
        if all(x == "F" for x in t):
            continue  # this choice of the unknowns turns the branch off everywhere
        if any((x != "F") != (r % NODE_SIZE == 0) for r, x in enumerate(t)):
            return False
        shown = True
    return shown
