"""Gradient accumulation decided per rank: where each rank chooses whether a backward runs under DDP's
``no_sync()`` (``ctx = nullcontext() if sync_now else model.no_sync()``, ``if not boundary: with
model.no_sync(): ...``).  When that choice reads a rank-local value (a token count, a shard's length), the
ranks leave ``no_sync()`` after different micro-batches: their gradient all-reduces pair with different
micro-batches and, at the end, one rank waits in an all-reduce the others never make.  The fact it rests on
is the probe's: the ranks' syncing forwards differ (``RankState.sync_forwards``) while one waits in DDP's
gradient all-reduce; the source says where the choice is made, the ranks' frames what it read.
"""
from __future__ import annotations

import ast

from ddp_doctor.evidence import RankState, Site
from ddp_doctor.diagnose.decision import Decision, user_stack, values_at, why_it_varies
from ddp_doctor.diagnose.source import (function_at, loop_targets, names_read, own_nodes, parse_file, reads_rank,
                                         source_of)

GRAD_SYNC = "ddp.backward(allreduce_grads)"


def _says_no_sync(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr == "no_sync" for n in ast.walk(node))


def _choice_in(fn: ast.AST) -> tuple[ast.AST, ast.expr] | None:
    """(the statement that chooses, its test): an `if` whose arm enters ``no_sync()``, or a conditional
    expression with ``no_sync`` in one arm (in a `with` or in the assignment of the name a `with` uses)."""
    for node in own_nodes(fn):
        if isinstance(node, ast.If) and any(isinstance(s, (ast.With, ast.AsyncWith)) and _says_no_sync(s.items[0].context_expr)
                                            for arm in (node.body, node.orelse) for s in arm):
            return node, node.test
        if isinstance(node, (ast.Assign, ast.With)):
            value = node.value if isinstance(node, ast.Assign) else node.items[0].context_expr
            cond = next((n for n in ast.walk(value) if isinstance(n, ast.IfExp)
                         and (_says_no_sync(n.body) or _says_no_sync(n.orelse))), None)
            if cond is not None:
                return node, cond.test
    return None


def _assigned(fn: ast.AST) -> set[str]:
    """Names the function assigns (``=``, ``+=``)."""
    return {t.id for n in own_nodes(fn) if isinstance(n, (ast.Assign, ast.AugAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}


def _parameters(fn: ast.AST) -> set[str]:
    args = getattr(fn, "args", None)
    return {a.arg for a in (args.posonlyargs + args.args + args.kwonlyargs)} if args is not None else set()


def _one_hop(fn: ast.AST, names: list[str], before: int) -> list[str]:
    """The names plus those their last assignment before line ``before`` read (``sync_now = tokens >= budget``)."""
    out = list(names)
    for name in names:
        assigns = [n for n in own_nodes(fn) if isinstance(n, ast.Assign) and n.lineno < before
                   and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
        if assigns:
            out += [x for x in names_read(max(assigns, key=lambda n: n.lineno).value) if x not in out]
    return out


def _in_grad_sync(st: RankState) -> bool:
    """Waiting in DDP's gradient all-reduce, or failed out of it (the peer it waited for ended)."""
    call = st.in_collective or (st.exc.collective if st.exc is not None else None)
    return call is not None and call.op == GRAD_SYNC


def sync_choice(ranks: dict[int, RankState]) -> Decision | None:
    """The ``no_sync()`` choice the ranks parted at, when the probe shows their gradient syncs diverged."""
    waiting = [r for r, st in sorted(ranks.items()) if _in_grad_sync(st)]
    with_ddp = {r: st for r, st in ranks.items() if st.forwards}
    if not waiting or len({st.sync_forwards for st in with_ddp.values()}) < 2:
        return None
    frames = [f for r in waiting for f in reversed(user_stack(ranks[r]))]  # innermost first, rank by rank
    for frame in frames:  # the innermost function that makes the choice
        parsed = parse_file(frame.path)
        if parsed is None:
            continue
        tree, lines = parsed
        fn = function_at(tree, frame.function, frame.line)
        found = _choice_in(fn)
        if found is None:
            continue
        stmt, test = found
        names = names_read(test)
        loop_vars = loop_targets(fn)
        # the choice reads a value the function itself keeps changing (a running count), or the rank;
        # `(step + 1) % accum` (a loop variable, a fixed argument) is the same on every rank at one step
        read = {n.split(".")[0] for n in _one_hop(fn, names, stmt.lineno)}
        kept = _assigned(fn) - loop_vars
        if not read & loop_vars:  # a flag the caller passes in (``train_step(..., sync=...)``) decides too
            kept |= _parameters(fn)
        if not (reads_rank(frame.path, fn, test) or read & kept):
            return None
        site = Site(frame.path, stmt.lineno, frame.function)
        order = waiting + [r for r in sorted(ranks) if r not in waiting]
        vals = values_at(ranks, order, site, _one_hop(fn, names, stmt.lineno))
        ways = tuple((r, f"synced gradients after {with_ddp[r].sync_forwards} of {with_ddp[r].forwards} forwards"
                      + (f" by its last report before {ranks[r].signal} killed it" if ranks[r].signal else ""))
                     for r in order if r in with_ddp)  # (a killed rank's counts are as old as its last post)
        cond = source_of(test, lines)
        why = (why_it_varies(cond, vals, reads_rank(frame.path, fn, test)) + " Each rank chooses on its own when to "
               "leave no_sync(), so its gradient all-reduces pair with other micro-batches on the other ranks and the "
               "ranks run different numbers of them: decide the accumulation boundary the same on every rank (a "
               "fixed number of micro-batches, or all_reduce the count or the flag first).")
        # the ranks still in a gradient sync when the others are elsewhere synced more often than those: the
        # fewer of the two groups took the odd way (left no_sync() where the others stayed in it, or stayed in it
        # where the others left it: a per-rank skip of the sync, DDP101 on them); of two ranks neither is odd
        more = tuple(r for r in waiting if r in with_ddp)
        fewer = tuple(r for r in sorted(with_ddp) if r not in more)
        odd = next((g for g in (more, fewer) if 2 * len(g) < len(with_ddp)), ())
        if isinstance(stmt, ast.If):
            return Decision(site, "if", cond, ways, vals, why, parting="skip" if odd else "branch", culprits=odd)
        shown = stmt if isinstance(stmt, ast.Assign) else stmt.items[0].context_expr
        return Decision(site, "value", source_of(shown, lines), ways, vals, why, parting="skip" if odd else "branch",
                        culprits=odd)
    return None
