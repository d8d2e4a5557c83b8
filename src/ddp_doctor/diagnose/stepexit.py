"""Where a rank left a training step or a training loop, from what the probe counted: a DDP forward no
backward followed (``skipped_syncs``), the loader passes' lengths and batches drawn.  Each explanation here
rests on such a count, never on the loop's shape alone."""
from __future__ import annotations

import ast
import os

from ddp_doctor.evidence import RankState, Site
from ddp_doctor.diagnose.decision import Decision, values_at, why_it_varies
from ddp_doctor.diagnose.source import (call_sites, function_at, keyword, names_read, own_nodes, parse_file,
                                         pick_test, reads_rank, source_of)


def trains(st: RankState) -> bool:
    """The rank waits in (or last made) a collective DDP issues for training: the loop it is in trains."""
    c = st.in_collective or st.last_collective
    return c is not None and c.op.startswith("ddp.")


def skipped_syncs(ranks: dict[int, RankState]) -> list[int]:
    """The ranks that skipped a gradient sync the others ran (a fact the probe counted: a DDP forward that
    prepared one and no backward before the next forward), at a forward line every other rank also ran the
    DDP model at (the training forward, not a forward only some ranks make: that is DDP202's)."""
    live = {r: st for r, st in ranks.items() if not st.missing}
    if len(live) < 2:
        return []
    low = min(st.syncs_skipped for st in live.values())
    out = []
    for r, st in sorted(live.items()):
        x = next((x for x in st.skipped_syncs if x.site), None)
        if st.syncs_skipped > low and x is not None and all(
                any(sc.op == "ddp.forward" and sc.site and sc.site.key() == x.site.key() for sc in o.site_counts)
                for q, o in live.items() if q != r):
            out.append(r)
    return out if len(out) < len(live) else []


_EXITS = (ast.Return, ast.Continue, ast.Break, ast.Raise)


def _exit_after(fn: ast.AST, line: int):
    """(exit statement, its test node) for the ways out of a step after ``line`` in ``fn``: an `if` whose arm
    holds a `return`/`continue`/`break`/`raise`, or an `except` whose handler holds one."""
    out = []
    for n in own_nodes(fn):
        if isinstance(n, ast.If) and n.lineno > line:
            stmt = next((s for s in n.body + n.orelse if isinstance(s, _EXITS)), None)
            if stmt is not None:
                out.append((stmt, n))
        elif isinstance(n, ast.Try) and (n.end_lineno or n.lineno) > line:  # a try around or after it
            for h in n.handlers:
                stmt = next((s for s in h.body if isinstance(s, _EXITS)), None)
                if stmt is not None:
                    out.append((stmt, h))
    return out


def sync_skip_exit(fault: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """A rank ran a DDP forward and no backward after it (a fact the probe counted, with the forward's line):
    the exit after that forward -- a `return`/`continue`/`break`/`raise` under an `if`, or an `except` that
    leaves -- in its function, else after the call in the function that called it (the same file, three deep),
    is where it left the step, whatever line the mismatch showed at later."""
    for r in fault:
        x = next((x for x in ranks[r].skipped_syncs if x.site), None) if r in ranks else None
        if x is None:
            continue
        order = list(fault) + [o for o in sorted(ranks) if o not in fault]
        at, depth = x.site, 0
        while at is not None and depth < 4:
            got = _exit_decision(at, x.site, fault, order, ranks)
            if got is not None:
                return got
            calls = call_sites(at.path, at.function)
            at, depth = (calls[0] if len(calls) == 1 else None), depth + 1
    return None


def _exit_decision(at: Site, forward: Site, fault: list[int], order: list[int], ranks) -> Decision | None:
    parsed = parse_file(at.path)
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, at.function, at.line)
    cands = _exit_after(fn, at.line)
    if not cands:
        return None
    function = at.function or "<module>"
    tests = [t for _s, t in cands if isinstance(t, ast.If)]
    node = pick_test(tests, at.path, fn,
                   lambda n: values_at(ranks, order, Site(at.path, n.lineno, function), names_read(n.test)))
    if node is None:  # the first way out after the forward (or its call)
        node = min((t for _s, t in cands), key=lambda t: t.lineno)
    stmt = next(s for s, t in cands if t is node)
    if isinstance(node, ast.ExceptHandler):
        caught = ast.unparse(node.type) if node.type is not None else "any exception"
        cond, vals, why = (f"except {caught}", (),
                           f"An exception raised on some ranks only (from their own data) is caught here, and the "
                           f"handler leaves the step with `{keyword(stmt)}`.")
    else:
        cond = source_of(node.test, lines)
        vals = values_at(ranks, order, Site(at.path, node.lineno, function), names_read(node.test))
        why = why_it_varies(cond, vals, reads_rank(at.path, fn, node.test))
    fwd = f"line {forward.line}" if forward.path == at.path else f"{os.path.basename(forward.path)}:{forward.line}"
    def went_on(o: int) -> str:  # (a rank that skipped fewer syncs: how many, not "never")
        n = ranks[o].syncs_skipped
        return "went on to backward" if not n else f"skipped fewer gradient syncs ({n})"

    ways = tuple((f, f"left the step at line {stmt.lineno} after the DDP forward at {fwd}, before any backward")
                 for f in fault) + tuple((o, went_on(o)) for o in sorted(ranks) if o not in fault)
    kind = "except" if isinstance(node, ast.ExceptHandler) else keyword(stmt)
    return Decision(Site(at.path, stmt.lineno, function), kind, cond, ways, vals, why, parting="skip",
                    culprits=tuple(fault))


def loader_counts(loop, path: str, left: int, stayed: int, ranks: dict[int, RankState]) -> str | None:
    """The recorded fact that a loop over the training DataLoader ran a different number of times on two ranks:
    the loader's len() differs, or the rank still in the loop has drawn more batches in this pass than the one
    that left drew in all.  Only for a loop whose iterable reads the name the DataLoader was bound to."""
    states = {r: ranks[r].train_loader_state() for r in (left, stayed)}
    if any(t is None or t.site is None for t in states.values()):
        return None
    bound = _bound_name(states[left].site)
    if bound is None or bound not in {n.split(".")[-1] for n in names_read(loop.iter)}:
        return None
    lens = {r: t.len for r, t in states.items()}
    if None not in lens.values() and lens[left] != lens[stayed]:
        return (f"it iterates the DataLoader built at {os.path.basename(path)}:{states[left].site.line}, whose "
                f"len() is {lens[left]} on rank {left} and {lens[stayed]} on rank {stayed}")
    drawn = {r: t.batches_by_epoch[-1] if t.batches_by_epoch else None for r, t in states.items()}
    if None not in drawn.values() and drawn[stayed] > drawn[left]:
        return (f"rank {left} left it after {drawn[left]} batch{'es' * (drawn[left] != 1)} of this pass; rank "
                f"{stayed} has drawn {drawn[stayed]} and is still in it")
    return None


def _bound_name(site: Site) -> str | None:
    """The name the call at ``site`` was assigned to (``loader = DataLoader(...)``, ``self.loader = ...``)."""
    parsed = parse_file(site.path)
    if parsed is None:
        return None
    for node in ast.walk(parsed[0]):
        if isinstance(node, ast.Assign) and node.lineno <= site.line <= (node.end_lineno or node.lineno) \
                and len(node.targets) == 1:
            t = node.targets[0]
            return t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
    return None
