"""A report's sentences checked against the facts the same report records.

A finding that says what its own evidence contradicts ("the ranks ran this loop a different number of
times" over ``range(200)``, "rank 0 left the loop" for a rank standing above it, "different numbers of
optimizer steps (rank 0: 16, rank 1: 16)") sends a user to the wrong line: worse than no explanation.  Every
report ``ddp-doctor run`` writes carries the result (``contradictions``, empty when none), and the tests
require it empty for every job they run.  Each check reads the report as written (plain JSON), so a saved
report can be checked again with the same code.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Contradiction:
    """A claim of a finding and the recorded fact it contradicts."""
    code: str    # the finding's code
    claim: str   # the words of the message that make the claim
    fact: str    # what the report records instead

    def to_json(self) -> dict[str, str]:
        return {"code": self.code, "claim": self.claim, "fact": self.fact}


_UNKNOWN_NUMBER = re.compile(r"\bNone(?:s\b|%| s\b| seconds\b| steps\b)")
_STEPS_DIFFER = re.compile(r"ran different numbers of optimizer steps \(([^)]*)\)")
_LOOP_COUNTS = re.compile(r"ran this loop a different number of times|yields a different number of items")
_YIELDS = re.compile(r"yields a different number of items")
_CONST_RANGE = re.compile(r"\bin range\(\s*\d+\s*(?:,\s*\d+\s*){0,2}\)$")
_LEFT_LOOP = re.compile(r"\branks? ([\d, ]+) left the loop\b")
_SPLIT = re.compile(r"split their batches into different numbers of micro-batches")
_LINT_SAW = re.compile(r"ddp-doctor lint flagged this line before the run \((DDP\d+)\)")
_LEFT_TRAINING = re.compile(r"\b[Rr]anks? ([\d, ]+) left the training loop\b")
_NO_BACKWARD = re.compile(r"\brank ([\d, ]+) ran a DDP forward that prepared a gradient sync and then no backward")


def _ranks(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text)]


def _frame_in(rank: dict[str, Any], site: dict[str, Any]) -> dict[str, Any] | None:
    """The rank's frame in the decision's function (by file name and function), innermost first."""
    for fr in reversed(rank.get("stack") or []):
        if fr.get("function") == site.get("function") and fr.get("path") and site.get("path") \
                and os.path.basename(fr["path"]) == os.path.basename(site["path"]):
            return fr
    return None


def _same_loaders(ranks: dict[int, dict[str, Any]]) -> str | None:
    """Every rank built the same DataLoaders (by line) and each has one len() on every rank: none of them
    yields a different number of batches per rank."""
    per = {r: {(ld.get("site") or {}).get("line"): ld.get("len") for ld in e.get("loaders") or []}
           for r, e in ranks.items()}
    tables = list(per.values())
    if len(tables) < 2 or not tables[0] or any(t != tables[0] for t in tables) or \
            not all(isinstance(n, int) and n >= 0 for n in tables[0].values()):
        return None
    return "every DataLoader has the same len() on every rank: " + ", ".join(
        f"line {line}: {n}" for line, n in sorted(tables[0].items(), key=lambda kv: kv[0] or 0))


def finding_contradictions(f: dict[str, Any], ranks: dict[int, dict[str, Any]]) -> list[Contradiction]:
    """What finding ``f`` (report form) says that its evidence or the report's rank entries contradict."""
    msg, ev, code = f.get("message") or "", f.get("evidence") or {}, f.get("code", "")
    out: list[Contradiction] = []
    if (m := _UNKNOWN_NUMBER.search(msg)) is not None:
        out.append(Contradiction(code, m.group(0), "a value that was never recorded is printed as a number"))
    if (m := _STEPS_DIFFER.search(msg)) is not None:
        counts = [int(n) for n in re.findall(r"rank \d+: (\d+)", m.group(1))]
        if len(counts) > 1 and len(set(counts)) == 1:
            out.append(Contradiction(code, m.group(0), "every rank's optimizer step count given is the same"))
    decision = ev.get("decision") if isinstance(ev.get("decision"), dict) else None
    cond = (decision or {}).get("condition") or ""
    if (m := _LOOP_COUNTS.search(msg)) is not None and decision and decision.get("kind") == "for" \
            and _CONST_RANGE.search(cond):
        out.append(Contradiction(code, m.group(0), f"`{cond}` yields the same number of items on every rank"))
    elif (m := _YIELDS.search(msg)) is not None:
        lens = [v for v in (ev.get("loader_len") or {}).values() if isinstance(v, int) and v >= 0]
        if len(lens) > 1 and len(set(lens)) == 1:
            out.append(Contradiction(code, m.group(0), f"len(loader) is {lens[0]} on every rank"))
        elif (same := _same_loaders(ranks)) is not None:
            out.append(Contradiction(code, m.group(0), same))
    if decision and decision.get("kind") in ("for", "while") and (m := _LEFT_LOOP.search(msg)) is not None:
        site = decision.get("site") or {}
        for r in _ranks(m.group(1)):
            fr = _frame_in(ranks.get(r) or {}, site)
            if fr is not None and isinstance(fr.get("line"), int) and fr["line"] < (site.get("line") or 0):
                out.append(Contradiction(code, m.group(0), f"rank {r} stands at line {fr['line']}, above the loop "
                                                           f"at line {site.get('line')}: it never entered it"))
    if (m := _LEFT_TRAINING.search(msg)) is not None:
        for r in _ranks(m.group(1)):
            if (ranks.get(r) or {}).get("step") == 0:
                out.append(Contradiction(code, m.group(0), f"rank {r} made no optimizer step: it was never in a "
                                                           "training loop"))
    if (m := _NO_BACKWARD.search(msg)) is not None and isinstance(ev.get("skipped_syncs"), dict):
        skipped = {int(r): n for r, n in ev["skipped_syncs"].items() if isinstance(n, int)}
        low = min(skipped.values(), default=0)
        for r in _ranks(m.group(1)):
            if r in skipped and skipped[r] <= low:
                out.append(Contradiction(code, m.group(0), f"rank {r} skipped {skipped[r]} gradient syncs, no more "
                                                           "than any other rank"))
    if (m := _SPLIT.search(msg)) is not None:
        counts = [n for n in (ev.get("microbatches") or {}).values() if isinstance(n, int)]
        if len(set(counts)) < 2:
            out.append(Contradiction(code, m.group(0), "the micro-batch counts recorded do not differ: "
                                                       f"{ev.get('microbatches')}"))
    if (m := _LINT_SAW.search(msg)) is not None and (ev.get("lint") or {}).get("code") != m.group(1):
        out.append(Contradiction(code, m.group(0), "no lint finding of that code is recorded on the line"))
    return out


def contradictions(report: dict[str, Any]) -> list[Contradiction]:
    """Every contradiction between a report's findings and the facts it records."""
    ranks = {r["rank"]: r for r in report.get("ranks") or [] if isinstance(r, dict) and isinstance(r.get("rank"), int)}
    return [c for f in report.get("findings") or [] if isinstance(f, dict) for c in finding_contradictions(f, ranks)]
