"""A decision where the ranks parted, as findings tell it, and what the ranks' frames say about it: each
rank's user stack and the values its condition's names held there (``FrameValues``, read by the probe when
the stacks were asked for), and why such a value differs between ranks.  Shared by the ways of finding a
decision (``provenance``: branches, loops, exits; ``grad_sync``: leaving DDP's ``no_sync()``)."""
from __future__ import annotations

import os
import re
from dataclasses import dataclass

from ddp_doctor.evidence import FrameValues, RankState, Site
from ddp_doctor.frames import is_user

_CLOCK_WORDS = re.compile(r"\btime\b|time\(|monotonic|perf_counter|clock|elapsed|deadline|seconds|wall", re.I)
_NAN_WORDS = re.compile(r"isnan|isfinite|isinf|\bnan\b|\binf\b", re.I)
_EMPTY_WORDS = re.compile(r"\bis None\b|\bis not None\b|\blen\(|numel\(|\bempty\b", re.I)
_NOT_NAME = re.compile(r"\bnot ([\w.]+)$")  # ``not preds``: an emptiness test, unless the name holds a flag
_FILE_WORDS = re.compile(r"exists\(|isfile\(|isdir\(|os\.path|glob\(|listdir\(", re.I)
_EMPTY = ("None", "list of 0", "tuple of 0", "dict of 0")
_NONFINITE = ("nan", "inf", "-inf")


@dataclass(frozen=True, slots=True)
class Decision:
    """The decision the ranks parted at, as a finding tells it."""
    site: Site                                   # the `if` of a branch; the `break`/`continue`/`return` of an exit
    kind: str                                    # "if" (a branch) | "return" | "break" | "continue" | "raise"
    condition: str                               # the test's source ("rank == 0", "val_loss < best")
    ways: tuple[tuple[int, str], ...]            # (rank, which way it went)
    values: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()  # (rank, the test's names and values)
    why: str = ""
    alone: tuple[int, ...] = ()  # ranks that went on into a collective the others' way skips (their call
    #                              is one only some ranks make: DDP201), when the decision shows it
    parting: str = "branch"      # what the ranks did there: "skip" (some skipped a training step the others
    #                              ran), "loop" (some left a training loop the others stayed in), "branch"
    culprits: tuple[int, ...] = ()  # the ranks that took the odd way, when the recorded facts say so
    by_lint: bool = False        # no stack showed it: the line lint located as a rank-local decision

    def text(self) -> str:
        """"The ranks parted at `if val_loss < best:` (train.py:57): rank 0 went into it, ...; values ..."."""
        what = {"if": f"`if {self.condition}:`", "decorator": f"`@{self.condition}`",
                "value": f"`{self.condition}`", "while": f"`while {self.condition}:`",
                "for": f"`for {self.condition}:`", "except": f"`{self.condition}:`"}.get(
            self.kind, f"`{self.kind}` under `if {self.condition}:`")
        by_way: dict[str, list[int]] = {}
        for r, w in self.ways:
            by_way.setdefault(w, []).append(r)
        ways = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} {w}" for w, rs in by_way.items())
        at = f"{what} ({os.path.basename(self.site.path)}:{self.site.line})"
        out = (f"No stack shows where the ranks parted; ddp-doctor lint located a rank-local {at} that "
               f"explains it." if self.by_lint else f"The ranks parted at {at}: {ways}.")
        if self.values:
            vals = "; ".join(f"rank {r}: " + ", ".join(f"{k}={v}" for k, v in kv) for r, kv in self.values)
            out += f" Values there when the job was diagnosed: {vals}."
        return out + (f" {self.why}" if self.why else "")

    def to_json(self) -> dict:
        return {"site": self.site.to_json(), "kind": self.kind, "condition": self.condition,
                "ways": {str(r): w for r, w in self.ways},
                "values": {str(r): dict(kv) for r, kv in self.values}, "why": self.why, "parting": self.parting,
                **({"by_lint": True} if self.by_lint else {})}


# -- the ranks' frames --------------------------------------------------------------------------
def user_stack(st: RankState) -> list[Site]:
    """The rank's user frames, outermost first.  faulthandler keeps the innermost 100 frames only, so a
    rank deep in an import (DDP's first call imports torch's dynamo) shows none of the user's: then the
    frames the probe read values from (its innermost user frames, from the live frame chain)."""
    frames = [f for f in st.stack if is_user(f.path)]
    if frames:
        return frames
    main = next((t for t in st.threads if t.main), None)
    if main is not None and main.values:
        return [fv.site for fv in reversed(main.values)]
    # a rank that failed inside a collective (a broken connection once the other rank ended): where it waited,
    # by its traceback; an error raised after a collective (a consequence of what it received) says nothing
    if st.exc and st.exc.collective:
        return [f for f in st.exc.traceback if is_user(f.path)]
    # no stack was taken (gloo aborted it first): the user line of the collective it was waiting in
    c = st.in_collective
    return [c.site] if c is not None and c.site is not None and is_user(c.site.path) and not st.exc \
        and not st.finished else []


def _frame_values(st: RankState, path: str, function: str | None) -> FrameValues | None:
    main = next((t for t in st.threads if t.main), None)
    for fv in main.values if main else ():
        if os.path.basename(fv.site.path) == os.path.basename(path) and fv.site.function == function:
            return fv
    return None


def values_at(ranks: dict[int, RankState], order: list[int], site: Site, names: list[str]):
    out = []
    for r in order:
        fv = _frame_values(ranks[r], site.path, site.function)
        if fv is None:
            continue
        got = dict(fv.values)
        kv = tuple((n, got[n]) for n in names if n in got)
        if kv:
            out.append((r, kv))
    return tuple(out)


def _tests_emptiness(condition: str, values) -> bool:
    """``not preds`` tests a container for emptiness -- but ``not sync_now`` over a recorded True/False tests a
    flag: then the values, not the form, say why the ranks differ."""
    m = _NOT_NAME.search(condition)
    if m is None:
        return False
    held = [v for _r, kv in values for k, v in kv if k == m.group(1)]
    return not (held and all(v in ("True", "False") for v in held))


def why_it_varies(condition: str, values, by_rank: bool) -> str:
    """Why a condition's value differs between ranks, from its text, the values seen, and whether it reads
    the rank (``by_rank``)."""
    seen = [v for _r, kv in values for _k, v in kv]
    if by_rank:
        return "The condition reads the rank itself: the ranks take different ways by design."
    if _NAN_WORDS.search(condition) or any(v.removeprefix("tensor(").rstrip(")") in _NONFINITE for v in seen):
        return "It tests for a NaN/inf, which one rank's own batch can produce while the others' do not."
    if _EMPTY_WORDS.search(condition) or (len(set(seen)) > 1 and any(v in _EMPTY for v in seen)) \
            or _tests_emptiness(condition, values):
        return "It tests for an empty or missing batch or shard, which only some ranks may get."
    if _FILE_WORDS.search(condition):
        return ("It reads the file system, which each rank sees on its own (a file one rank wrote, a node-local "
                "disk, a race with the rank that writes it).")
    if _CLOCK_WORDS.search(condition):
        return "It reads the wall clock, which differs between ranks."
    if len({kv for _r, kv in values}) > 1:
        return ("Its values differ between the ranks: they are computed from each rank's own data (a shard-local "
                "metric or count), so each rank decides differently.")
    return "It is computed from each rank's own data, so the ranks can decide differently."
