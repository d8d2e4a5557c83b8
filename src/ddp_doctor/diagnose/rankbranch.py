"""Rank branches: the `if` on the rank whose arm holds a rank's line, taken by some ranks only, and the
decorators that run a function on some ranks only (``@rank_zero_only``, a project's ``@main_process_only``)
-- found in a rank's frames, or through the one call site of a function no stack showed."""
from __future__ import annotations

import ast
import re

from ddp_doctor.evidence import RankState, Site
from ddp_doctor.diagnose.decision import Decision, user_stack, values_at, why_it_varies
from ddp_doctor.diagnose.source import (RANK_WORDS, arm, call_sites, function_at, names_read, own_nodes, parse_file,
                                         reads_rank, source_of)


def branch_in(frames: list[Site], inside: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """The outermost rank branch among a rank's ``frames`` (outermost first) taken by ranks ``inside`` only --
    or, when that branch is in a decorator's wrapper, the decoration of the function it wraps."""
    for k, frame in enumerate(frames):
        got = rank_branch(frame, inside, ranks)
        if got is not None and k + 1 < len(frames):
            got = _decorated(frame, frames[k + 1], inside, ranks) or got
        if got is not None:
            return got
    return None


def _decorated(wrapper: Site, inner: Site, inside: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """``wrapper`` is the closure of a decorator (a def inside a def) and ``inner``'s function is decorated with
    that decorator: the decoration is where the user chose to run it on some ranks only, whatever its name."""
    outer_parsed, inner_parsed = parse_file(wrapper.path), parse_file(inner.path)
    if outer_parsed is None or inner_parsed is None:
        return None
    fn = function_at(outer_parsed[0], wrapper.function, wrapper.line)
    outer = next((d.name for d in ast.walk(outer_parsed[0]) if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef))
                  and fn in d.body), None)
    target = function_at(inner_parsed[0], inner.function, inner.line)
    for dec in getattr(target, "decorator_list", ()):
        name = ast.unparse(dec.func if isinstance(dec, ast.Call) else dec)
        if outer is not None and name.split(".")[-1] == outer:
            return _decoration(inner, dec.lineno, name, inside, ranks, " (its wrapper tests the rank)")
    return None


def _decoration(frame: Site, line: int, name: str, inside: list[int], ranks, how: str = "") -> Decision:
    """The decoration ``@name`` at ``line`` of ``frame``'s function, run by ranks ``inside`` only."""
    ways = tuple((r, f"ran {frame.function}()") for r in inside) + tuple(
        (r, "skipped it") for r in sorted(ranks) if r not in inside)
    return Decision(Site(frame.path, line, frame.function), "decorator", name, ways, (),
                    f"`@{name}` runs {frame.function}() on some ranks only{how}, so everything inside it must be "
                    "rank-local: no collective, no barrier, no DDP forward.")


def rank_branch(frame: Site, inside: list[int], ranks: dict[int, RankState]) -> Decision | None:
    """The `if` on the rank whose arm holds ``frame``'s line, taken by ranks ``inside`` only (the others are
    elsewhere or gone): without the others' values only a test that reads the rank itself is the decision."""
    parsed = parse_file(frame.path)
    if parsed is None:
        return None
    tree, lines = parsed
    fn = function_at(tree, frame.function, frame.line)
    cands = [n for n in own_nodes(fn) if isinstance(n, ast.If) and arm(n, frame.line) in ("body", "orelse")
             and reads_rank(frame.path, fn, n.test)]
    if not cands:
        return _rank_decorator(fn, frame, inside, ranks)
    node = min(cands, key=lambda n: n.lineno)
    function = fn.name if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else "<module>"
    site = Site(frame.path, node.lineno, function)
    names, cond = names_read(node.test), source_of(node.test, lines)
    order = list(inside) + [r for r in sorted(ranks) if r not in inside]
    way = "went into it" if arm(node, frame.line) == "body" else "took its `else`"
    ways = tuple((r, way) for r in inside) + tuple((r, "did not") for r in sorted(ranks) if r not in inside)
    return Decision(site, "if", cond, ways, values_at(ranks, order, site, names), why_it_varies(cond, (), True))


def _rank_decorator(fn: ast.AST, frame: Site, inside: list[int], ranks) -> Decision | None:
    """``@rank_zero_only`` (Lightning), ``@on_main_process`` (accelerate): the function runs on some ranks only."""
    for dec in getattr(fn, "decorator_list", ()):
        name = ast.unparse(dec.func if isinstance(dec, ast.Call) else dec)
        if RANK_WORDS.search(name) or re.search(r"main_process|rank_zero|local_main", name):
            return _decoration(frame, dec.lineno, name, inside, ranks)
    return None


def caller_branch(site: Site, fault: list[int], ranks: dict[int, RankState], depth: int = 0) -> Decision | None:
    """The rank branch around the one place the file calls ``site``'s function, or around that caller's one
    call, three deep: where the ranks parted when no stack showed the callers (``if rank == 0:
    evaluate(model)``, the rank failing before its stack was taken)."""
    files = tuple(sorted({fr.path for st in ranks.values() for fr in user_stack(st)}))  # the job's own files
    calls = call_sites(site.path, site.function, files) if depth < 3 else []
    if len(calls) != 1:
        return None
    return rank_branch(calls[0], fault, ranks) or caller_branch(calls[0], fault, ranks, depth + 1)
