"""Where the ranks parted: the decision a step-family finding is about (the branch, the ``break``, the early
``return``), which way each rank went there, the values its condition read on each rank, and why they vary.

Walks each rank's user stack from the outermost frame to the last frame the ranks share; in that frame's
function (the source, parsed with ``ast``) the branch whose arms hold the ranks' lines, or the loop one rank
left, is the decision.  A rank inside a helper the others already left points at the helper's early exit.
Values come from the ranks' own frames (``FrameValues``, read by the probe when the stacks were asked for);
nothing is executed.  Reads the user's source files (the one I/O of the diagnosis).
"""
from __future__ import annotations

import ast
from dataclasses import replace

from ddp_doctor.evidence import RankState, Site
from ddp_doctor.diagnose.decision import Decision, user_stack, values_at, why_it_varies
from ddp_doctor.diagnose.rankbranch import branch_in
from ddp_doctor.diagnose.stepexit import loader_counts, trains
from ddp_doctor.diagnose.source import (LOOPS, arm, continues_in, exits_in, function_at,
                                         keyword, names_read, own_nodes, parse_file, pick_test, reads_rank,
                                         set_on_some_ranks, source_of, within)


# -- locating ----------------------------------------------------------------------------------------
def _aligned(sa: list[Site], sb: list[Site]) -> tuple[list[Site], list[Site]]:
    """Both stacks from their first common function on (one may lack outer frames)."""
    same = lambda x, y: x.path == y.path and x.function == y.function  # noqa: E731
    for j, f in enumerate(sa):
        k = next((k for k, g in enumerate(sb) if same(f, g)), None)
        if k is not None:
            return sa[j:], sb[k:]
    return sa, sb


def locate(fault: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """The decision the ranks ``fault`` parted from the others at, found from where each rank is now."""
    a = next((r for r in fault if r in ranks and user_stack(ranks[r])), None)
    if a is None:
        return _finished_left(fault, ranks)
    sa = user_stack(ranks[a])
    # another rank not at fault; when every rank is (a mismatch), one that stands somewhere else
    others = [r for r in sorted(ranks) if r not in fault] or [r for r in sorted(ranks) if r != a]
    b = next((r for r in others if user_stack(ranks[r]) and user_stack(ranks[r]) != sa), None)
    if b is None:
        return None
    sa, sb = _aligned(sa, user_stack(ranks[b]))
    i = 0
    while i < min(len(sa), len(sb)) and sa[i].path == sb[i].path and sa[i].function == sb[i].function:
        if sa[i].line != sb[i].line:
            return _parted_in(sa[i].path, sa[i].function, {a: sa[i].line, b: sb[i].line}, a, b, ranks, sa, sb, i)
        i += 1
    # the others are not in the functions rank ``a`` is in now (a framework called a hook on one rank only):
    # a branch on the rank there, the outermost first -- the function's own decorator that runs it on some
    # ranks only (``@main_process_only``) before the branch inside that decorator's wrapper
    return branch_in(sa[i:], [a], ranks)


def _finished_left(fault: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """A rank at fault finished its program after training steps (no stack: it is gone) while another is
    still in a training loop: it left every loop, so the loop the other is in -- its exit, or the skip that
    made it leave early -- is where they parted, judged as for a rank standing past the loop's end."""
    a = next((r for r in fault if r in ranks and ranks[r].finished and ranks[r].step > 0), None)
    b = next((r for r in sorted(ranks) if r not in fault and user_stack(ranks[r])), None)
    if a is None or b is None:
        return None
    for frame in user_stack(ranks[b]):  # the outermost frame inside a loop
        parsed = parse_file(frame.path)
        if parsed is None:
            continue
        tree, lines = parsed
        fn = function_at(tree, frame.function, frame.line)
        if any(isinstance(n, LOOPS) and within(n, frame.line) for n in own_nodes(fn)):
            if exited_inside_loop(ranks[a], [ranks[b]]):
                return None  # it ended its process inside this loop (sys.exit): it left no loop by its test
            past = (getattr(fn, "end_lineno", None) or len(lines)) + 1
            return _loop_exit(fn, lines, {a: past, b: frame.line}, a, b, ranks, frame.path, frame.function or
                              "<module>", sure=True)
    return None


def exited_inside_loop(st: RankState, others: list[RankState]) -> bool:
    """The rank called sys.exit() (or raised SystemExit) inside a loop another rank still stands in -- at a line of
    that loop, or in a function called from one (its exit's frames: ``exit_stack``): it ended its process there, it
    did not leave the loop."""
    frames = st.exit_stack or ((st.exit_site,) if st.exit_site is not None else ())
    for o in others:
        for frame in user_stack(o):
            mine = [f.line for f in frames if f.path == frame.path and f.function == frame.function]
            parsed = parse_file(frame.path) if mine else None
            if parsed is None:
                continue
            fn = function_at(parsed[0], frame.function, frame.line)
            if any(isinstance(n, LOOPS) and within(n, frame.line) and within(n, line)
                   for n in own_nodes(fn) for line in mine):
                return True
    return False


def _parted_in(path, function, line, a, b, ranks, sa, sb, depth) -> Decision | None:
    parsed = parse_file(path)
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, function, line[a])
    # a loop one rank left: a branch inside it cannot be where they parted (the ranks are not in one
    # iteration), when the loop's exit or its own test shows why they ran it differently
    left = _loop_exit(fn, lines, line, a, b, ranks, path, function, sure=True)
    if left is not None:
        return left
    branch = _branch(fn, lines, line, a, b, ranks, path, function)
    if branch is not None:
        return branch
    left = _loop_exit(fn, lines, line, a, b, ranks, path, function)
    if left is not None:
        return left
    # one rank is still inside a helper the other already left: that helper's early exit, else the branch on
    # the rank in it that the other skipped
    for inner, outer, other in ((sa, a, b), (sb, b, a)):
        if len(inner) > depth + 1:
            got = _early_exit(inner[depth + 1], outer, other, ranks)
            if got is not None:
                return got
    for inner, outer in ((sa, a), (sb, b)):
        got = branch_in(inner[depth + 1:], [outer], ranks)
        if got is not None:
            return got
    return None


def _branch(fn, lines, line, a, b, ranks, path, function) -> Decision | None:
    cands = [n for n in own_nodes(fn) if isinstance(n, ast.If) and arm(n, line[a]) != arm(n, line[b])
             and {arm(n, line[a]), arm(n, line[b])} & {"body", "orelse"}]
    if not cands:
        return None
    order = [a, b] + [r for r in sorted(ranks) if r not in (a, b)]
    site_of = lambda n: Site(path, n.lineno, function)  # noqa: E731
    node = pick_test(cands, path, fn,
                   lambda n: values_at(ranks, order, site_of(n), names_read(n.test)))
    if node is None:
        return None
    way = {"body": "went into it", "orelse": "took its `else`", "test": "was evaluating it",
           None: "went past it"}
    ways = []
    for r in order:  # every rank whose stack holds this function: which arm its line is in
        at = line.get(r) or next((f.line for f in user_stack(ranks[r]) if f.path == path and f.function == function),
                                 None)
        if at is not None:
            ways.append((r, way[arm(node, at)]))
    names, cond = names_read(node.test), source_of(node.test, lines)
    vals = values_at(ranks, order, site_of(node), names)
    # the ranks inside an arm that does not leave (no return/raise/break/continue) come back to the others'
    # path: their collective there is one the others skip; an arm that leaves is the others' alternative
    inside = tuple(r for r, w in ways if w == "went into it")
    alone = inside if inside and len(inside) < len(ways) and not any(
        isinstance(n, (ast.Return, ast.Raise, ast.Break, ast.Continue)) for s in node.body for n in ast.walk(s)) \
        and all(w == "went past it" for r, w in ways if r not in inside) else ()
    return Decision(site_of(node), "if", cond, tuple(ways), vals, why_it_varies(cond, vals, reads_rank(path, fn, node.test)),
                    alone)


def _loop_exit(fn, lines, line, a, b, ranks, path, function, sure: bool = False) -> Decision | None:
    """One rank left a loop the other is still in: the loop's rank-varying `break` or `return`, else the loop
    itself.  ``sure``: only an exit or a loop header whose test reads the rank or whose values differ."""
    for left, stayed in ((a, b), (b, a)):
        # a rank "left" a loop only when its line is past the loop's end: one above it never entered it
        loops = [n for n in own_nodes(fn) if isinstance(n, LOOPS) and within(n, line[stayed])
                 and line[left] > (n.end_lineno or n.lineno)]
        order = [left, stayed]
        parting = "loop" if trains(ranks[stayed]) else "branch"
        for loop in sorted(loops, key=lambda n: -n.lineno):  # the innermost loop first
            exits = exits_in(loop)
            node = pick_test([c for _e, c in exits], path, fn,
                           lambda n: values_at(ranks, order, Site(path, n.lineno, function), names_read(n.test)),
                           sure=sure) if exits else None
            if node is None:
                continue
            stmt = next(e for e, c in exits if c is node)
            names = names_read(node.test)
            vals = values_at(ranks, order, Site(path, node.lineno, function), names)
            verb = "returned" if isinstance(stmt, ast.Return) else "left the loop"
            ways = ((left, f"{verb} at line {stmt.lineno}"), (stayed, "stayed in the loop"),
                    *_stayed_too(loop, path, function, ranks, order))
            why = set_on_some_ranks(path, fn, node.test) or why_it_varies(source_of(node.test, lines), vals,
                                                                         reads_rank(path, fn, node.test))
            return Decision(Site(path, stmt.lineno, function), keyword(stmt), source_of(node.test, lines), ways, vals,
                            why, parting=parting, culprits=(left,))
        # it left first because it skipped steps in a loop, not because it ran it fewer times: the skip of the
        # innermost loop that has one (a `continue` of the training loop while the rank still in it stands in a
        # gradient-accumulation loop inside it, which has none)
        skipper = next((n for n in sorted(loops, key=lambda n: -n.lineno) if continues_in(n)), None)
        if skipper is not None and (skip := _skipped_step(skipper, lines, left, stayed, ranks, path, fn,
                                                          function)) is not None:
            return skip
        if loops:  # no rank-varying exit: the loop itself, when a recorded fact shows it ran unevenly
            header, evident = _loop_header(max(loops, key=lambda n: n.lineno), lines, left, stayed, ranks, path, fn,
                                           function)
            if evident:
                return header
    return None


def _stayed_too(loop, path: str, function: str, ranks: dict[int, RankState], told) -> tuple[tuple[int, str], ...]:
    """The ranks besides those ``told`` whose stack stands inside ``loop`` now: they stayed in it too (a
    fact of their own stacks; a third rank elsewhere is left unsaid)."""
    return tuple((r, "stayed in the loop") for r in sorted(ranks) if r not in told and any(
        f.path == path and f.function == function and within(loop, f.line) for f in user_stack(ranks[r])))


def _skips(st: RankState) -> int:
    """Batches this rank drew from its training loader and ran no optimizer step for (the probe counts them)."""
    tl = st.train_loader_state()
    return sum(tl.skips_by_epoch) if tl is not None else 0


def _steps_run(st: RankState) -> int:
    """Optimizer steps the rank completed, and the one it is in when it waits (or failed) in DDP's gradient
    sync."""
    c = st.in_collective or (st.exc.collective if st.exc else None)
    return st.step + (1 if c is not None and c.op.startswith("ddp.backward") else 0)


def _skipped_step(loop, lines, left, stayed, ranks, path, fn, function) -> Decision | None:
    """The rank that left the loop first had skipped more batches than the one still in it, or left it after
    fewer optimizer steps than the one still in it has already run, in a loop whose own header gives no rank
    a different count (facts the probe counted): it ran out of collectives early because of a `continue` in
    the loop (a `while True` whose counter moved on a skipped step), not a shorter loop.  The `continue` whose
    test reads the rank or holds different values, else the loop's only one."""
    by_batches = _skips(ranks[left]) > _skips(ranks[stayed])
    by_steps = not by_batches and ranks[left].step < _steps_run(ranks[stayed]) and not _loop_header(
        loop, lines, left, stayed, ranks, path, fn, function)[1]
    if not (by_batches or by_steps):
        return None
    cands = continues_in(loop)
    order = [left, stayed]
    node = pick_test([c for _s, c in cands], path, fn,
                   lambda n: values_at(ranks, order, Site(path, n.lineno, function), names_read(n.test)))
    if node is None:
        return None
    stmt = next(s for s, c in cands if c is node)
    vals = values_at(ranks, order, Site(path, node.lineno, function), names_read(node.test))
    n_left = _skips(ranks[left])
    still = (stayed, *(o for o, _w in _stayed_too(loop, path, function, ranks, order)))  # every rank in the loop
    if by_batches:
        ways = ((left, f"skipped the rest of a step at line {stmt.lineno} ({n_left} batch{'es' * (n_left != 1)} "
                       "drawn with no optimizer step in the whole run)"),
                *((r, f"trained on its batches ({_skips(ranks[r])} skipped)") for r in still))
    else:
        ways = ((left, f"left the loop after {ranks[left].step} optimizer steps"),
                *((r, f"is still in it, in step {_steps_run(ranks[r])}") for r in still))
    return Decision(Site(path, stmt.lineno, function), keyword(stmt), source_of(node.test, lines), ways, vals,
                    why_it_varies(source_of(node.test, lines), vals, reads_rank(path, fn, node.test)),
                    parting="skip", culprits=(left,))


def _loop_header(loop, lines, left, stayed, ranks, path, fn, function) -> tuple[Decision, bool]:
    """The loop as the decision, and whether its test or iterable shows it: it reads the rank, or its names
    hold different values on the ranks (``batches`` 4 on rank 0, 3 on rank 1)."""
    ways = ((left, "left the loop"), (stayed, "stayed in the loop"), *_stayed_too(loop, path, function, ranks,
                                                                                 [left, stayed]))
    at = Site(path, loop.lineno, function)
    expr = loop.test if isinstance(loop, ast.While) else loop.iter
    vals = values_at(ranks, [left, stayed], at, names_read(expr))
    by_rank = reads_rank(path, fn, expr)
    fewer = _left_by_its_test(fn, loop, left, stayed, ranks)
    evident = by_rank or len({kv for _r, kv in vals}) > 1 or fewer
    parting = "loop" if trains(ranks[stayed]) else "branch"
    steps = (f"Rank {left} left it after {ranks[left].step} optimizer steps while rank {stayed} trains in it, in step "
             f"{_steps_run(ranks[stayed])}; the loop has no `break`, `return` or `continue`: its test let rank {left} "
             "out sooner. ") if fewer else ""
    if isinstance(loop, ast.While):
        cond = source_of(loop.test, lines)
        return Decision(at, "while", cond, ways, vals, steps + why_it_varies(cond, vals, by_rank), parting=parting,
                        culprits=(left,)), evident
    cond = f"{ast.unparse(loop.target)} in {source_of(loop.iter, lines)}"
    count = _rank_assignment(fn, loop.iter, path)  # the rank-local value the loop counts with
    if count is not None:
        return Decision(Site(path, count.lineno, function), "value", source_of(count, lines), ways,
                        values_at(ranks, [left, stayed], Site(path, count.lineno, function), names_read(count.value)),
                        f"`for {cond}:` runs a different number of times per rank: the count comes from the rank.",
                        parting=parting, culprits=(left,)), True
    if by_rank:
        return Decision(at, "for", cond, ways, vals,
                        f"`for {cond}:` runs a different number of times per rank: its count reads the rank.",
                        parting=parting, culprits=(left,)), True
    counts = loader_counts(loop, path, left, stayed, ranks)
    if counts is not None:
        return Decision(at, "for", cond, ways, vals, f"The ranks ran this loop a different number of times: {counts}.",
                        parting=parting, culprits=(left,)), True
    # no recorded fact says the loop ran a different number of times on the ranks: claim nothing about it
    return Decision(at, "for", cond, ways, vals, steps.strip(), parting=parting, culprits=(left,)), evident


def _left_by_its_test(fn, loop, left, stayed, ranks) -> bool:
    """The rank that left a training loop ran fewer optimizer steps than the one still training in it has
    reached (facts the probe counted), and the loop has no way out but its own test -- no `break`, `return`,
    `continue` or inner loop: its test ended the loop sooner on that rank (a per-rank time or token budget
    in ``while spent < budget:``), even when no value read at the test survives to show it.  Not a loop
    inside another loop of the function: the rank still in it may have left it too and come back in the
    outer loop's next round (an epoch's batches, then a step only one rank made between epochs)."""
    nested = any(isinstance(n, LOOPS) and n is not loop and n.lineno < loop.lineno
                 and (n.end_lineno or n.lineno) >= (loop.end_lineno or loop.lineno) for n in own_nodes(fn))
    return (not nested and trains(ranks[stayed]) and ranks[left].step < _steps_run(ranks[stayed])
            and not exits_in(loop) and not continues_in(loop)
            and not any(isinstance(n, (*LOOPS, ast.Break, ast.Return)) for s in loop.body for n in ast.walk(s)))


def _rank_assignment(fn: ast.AST, expr: ast.expr, path: str) -> ast.Assign | None:
    """The last assignment before ``expr`` of a name it reads, from a value that reads the rank."""
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    found = [n for n in own_nodes(fn) if isinstance(n, ast.Assign) and n.lineno < expr.lineno
             and any(isinstance(t, ast.Name) and t.id in names for t in n.targets) and reads_rank(path, fn, n.value)]
    return max(found, key=lambda n: n.lineno) if found else None


def _early_exit(frame: Site, inside: int, other: int, ranks) -> Decision | None:
    """Rank ``inside`` is still in helper ``frame`` that rank ``other`` already left: an early `return`
    (or `raise`) under an `if` above the helper's current line."""
    parsed = parse_file(frame.path)
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, frame.function, frame.line)
    if fn is tree:
        return None
    cands = []
    for node in own_nodes(fn):
        if isinstance(node, ast.If) and (node.end_lineno or node.lineno) < frame.line:
            stmt = next((s for s in node.body + node.orelse if isinstance(s, (ast.Return, ast.Raise))), None)
            if stmt is not None:
                cands.append(node)
    order = [inside, other]
    node = pick_test(cands, frame.path, fn,
                   lambda n: values_at(ranks, order, Site(frame.path, n.lineno, frame.function), names_read(n.test)))
    if node is None:
        return None
    stmt = next(s for s in node.body + node.orelse if isinstance(s, (ast.Return, ast.Raise)))
    names = names_read(node.test)
    vals = values_at(ranks, order, Site(frame.path, node.lineno, frame.function), names)
    # every rank standing in the helper past that exit went on, as ``inside`` did
    went_on = {r: f.line for r, st in sorted(ranks.items()) for f in user_stack(st)
               if f.path == frame.path and f.function == frame.function and f.line > stmt.lineno}
    went_on[inside] = frame.line
    ways = ((other, f"returned early from {frame.function}() at line {stmt.lineno}"),) + tuple(
        (r, f"went on in {frame.function}() to line {ln}") for r, ln in sorted(went_on.items()))
    return Decision(Site(frame.path, stmt.lineno, frame.function), keyword(stmt), source_of(node.test, lines), ways, vals,
                    why_it_varies(source_of(node.test, lines), vals, reads_rank(frame.path, fn, node.test)),
                    tuple(sorted(went_on)))


def explain_at(site: Site, fault: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """The decision at a line found statically (lint's `continue`/`break`/`return`): its condition, and the
    values its names hold in the ranks still inside that function."""
    parsed = parse_file(site.path)
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, site.function, site.line)
    exit_types = (ast.Continue, ast.Break, ast.Return, ast.Raise)
    for node in own_nodes(fn):
        if isinstance(node, ast.If) and any(isinstance(s, exit_types) and s.lineno == site.line
                                            for s in node.body + node.orelse):
            function = fn.name if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else "<module>"
            names = names_read(node.test)
            order = list(fault) + [r for r in sorted(ranks) if r not in fault]
            vals = values_at(ranks, order, Site(site.path, node.lineno, function), names)
            stmt = next(s for s in node.body + node.orelse if s.lineno == site.line)
            verb = {ast.Continue: "skipped the rest of a step", ast.Break: "left the loop",
                    ast.Return: "returned early", ast.Raise: "raised"}[type(stmt)]
            ways = tuple((r, f"{verb} at line {site.line}") for r in fault)
            why = set_on_some_ranks(site.path, fn, node.test) or why_it_varies(
                source_of(node.test, lines), vals, reads_rank(site.path, fn, node.test))
            return Decision(Site(site.path, site.line, function), keyword(stmt), source_of(node.test, lines), ways, vals,
                            why, by_lint=True)
    return None


def thread_loop(site: Site, fault: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """A culprit's own thread (not its main thread) stands at ``site``, and the others' thread that ran that
    line has ended: the loop around the line, when its count reads the rank (``range(40 + rank)``)."""
    culprit = ranks.get(fault[0]) if fault else None
    on_thread = culprit is not None and any(not t.main and any(f.path == site.path and f.line == site.line
                                                                 for f in t.frames) for t in culprit.threads)
    others = [r for r in sorted(ranks) if r not in fault]
    parsed = parse_file(site.path) if on_thread and others else None
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, site.function, site.line)
    loops = [n for n in own_nodes(fn) if isinstance(n, LOOPS) and within(n, site.line)]
    if not loops:
        return None
    d, evident = _loop_header(max(loops, key=lambda n: n.lineno), lines, others[0], fault[0], ranks, site.path, fn,
                              site.function)
    return replace(d, parting="branch", culprits=tuple(fault)) if evident else None


def group_choice(site: Site, fault: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """The assignment that chose the group variable a collective at ``site`` was passed, when ranks ``fault``
    got a group they are not members of there (``pair = pairs[rank % 2]``)."""
    ways = tuple((r, "got a group without this rank") for r in fault) + tuple(
        (r, "got a group with this rank") for r in sorted(ranks) if r not in fault)
    return value_choice(site, ("group", "process_group"), None, fault, ranks, ways,
                        "The group is picked from a rank-dependent value; on the ranks not in the group it picked, "
                        "new_group() had returned a placeholder and torch skips the collective.", same_line=True)


def value_choice(site: Site, keywords: tuple[str, ...], position: int | None, fault: list[int],
                 ranks: dict[int, RankState], ways, why: str = "", same_line: bool = False) -> Decision | None:
    """The assignment that chose the variable passed as ``keywords`` (or argument ``position``) to a call in the
    function at ``site`` -- on ``site``'s own line when ``same_line``, else the last such call up to it -- where
    the ranks got different values (``ways``: what each rank passed, facts the probe recorded), with the values
    the assignment's names held in the ranks' frames."""
    parsed = parse_file(site.path)
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, site.function, site.line)

    def passed(call: ast.Call):
        arg = next((kw.value for kw in call.keywords if kw.arg in keywords), None)
        if arg is None and position is not None and len(call.args) > position:
            arg = call.args[position]
        return arg.id if isinstance(arg, ast.Name) else None

    calls = [n for n in own_nodes(fn) if isinstance(n, ast.Call) and passed(n)
             and (n.lineno == site.line if same_line else n.lineno <= site.line)]
    if not calls:
        return None
    name = passed(max(calls, key=lambda n: n.lineno))
    call_line = max(calls, key=lambda n: n.lineno).lineno
    assigns = [n for n in own_nodes(fn) if isinstance(n, ast.Assign) and n.lineno < call_line
               and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    if not assigns:
        return None
    node = max(assigns, key=lambda n: n.lineno)
    function = fn.name if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else "<module>"
    at = Site(site.path, node.lineno, function)
    names = [n for n in names_read(node.value) if n != name]
    order = list(fault) + [r for r in sorted(ranks) if r not in fault]
    vals = values_at(ranks, order, at, names)
    text = source_of(node, lines)
    if not why and reads_rank(site.path, fn, node.value):
        why = f"`{text}` reads the rank itself: each rank computes its own value by design."
    return Decision(at, "value", text, tuple(ways), vals, why or why_it_varies(text, vals, False))
