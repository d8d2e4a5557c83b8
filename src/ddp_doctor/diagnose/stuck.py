"""Where the culprit of a stuck job is decided, for every way of seeing it: ``run``'s probe states, ``attach``'s
stack samples, a Flight Recorder dump's first position where the ranks parted.

Each source is one small class that implements :class:`EvidenceSource` (in the spirit of Lightning's
``ClusterEnvironment``): it hands the judge each rank's :class:`Standing` (in which collective it waits, or
outside collectives, gone, still moving), the ranks' history where it has one (``run``'s probe states: the
collectives each rank ever issued and where) and lint's marks.  :func:`judge` decides once -- the kind of
situation, the code, the culprit ranks and the line -- and the source only words it with the facts it has
(docs/verdicts.md, "The culprit"):

* ranks wait at one collective position in different collectives: they paired calls that never match
  (``blame_calls``);
* some ranks wait in a collective while others are outside collectives: the outside ones stall the job
  (DDP205: stuck on their data, on a peer outside the job, or back from a collective they ran before) --
  unless lint flags the waiting ranks' collective as rank-conditional, or the history shows the others never
  ran it: then the waiting ones are in a collective the others never reach (DDP201, DDP202);
* ranks wait in different collectives: the odd ones out (``blame_calls``);
* a rank gone while the others wait (and nothing among the live ranks explains it): DDP204;
* a rank that moves: no hang (yet);
* every rank waits in the same collective and it never completes: the transport is stuck (DDP205);
* every rank stuck outside collectives: DDP205 on all of them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Mapping, Protocol, Sequence

from ddp_doctor.diagnose.blame import Blame, agreement, blame_calls, lint_code_at
from ddp_doctor.evidence import Collective, LintMark, RankState, Site

DATA, PEER = "data", "peer"  # what a rank outside collectives is known to wait on (``Standing.waits_on``)


@dataclass(frozen=True)
class Standing:
    """One rank as the judge sees it, whoever looked."""

    rank: int
    call: Collective | None = None  # the collective it waits in; None: outside collectives
    gone: bool = False              # exited, no process, no record: it can join nothing any more
    moving: bool = False            # it showed a sign of life while it was looked at (attach's samples)
    waits_on: str | None = None     # outside collectives: DATA (its DataLoader), PEER (a process outside the job)


class EvidenceSource(Protocol):
    """A way of seeing a job, as the judge asks it: one small class per source, nothing else source-specific."""

    def standings(self) -> Mapping[int, Standing]:
        """Every rank the source knows of, where it stands now (or where the ranks parted)."""

    def history(self) -> Mapping[int, RankState] | None:
        """What each rank ever did (``run``'s probe states: ``sites_seen``, forwards), None where unknown."""

    def lint(self) -> Sequence[LintMark]:
        """lint's marks on the user's files (rank-conditional lines)."""


class Kind(str, Enum):
    """The situation the judge found; the source words each kind."""

    NONE = "none"            # no live rank: nothing to judge
    BUSY = "busy"            # a rank moves: not a hang (yet)
    PAIRED = "paired"        # ranks at one position disagree (or wait in different collectives): ``blame_calls``
    STALL = "stall"          # ranks outside collectives hold up the ranks that wait for them
    SUBSET = "subset"        # ranks wait in a collective the others never enter
    GONE = "gone"            # a rank ended while the others wait
    TRANSPORT = "transport"  # every rank waits in the same collective and it never completes
    IDLE = "idle"            # no rank is in a collective and none moves


@dataclass(frozen=True)
class Stuck:
    """The judge's decision: the kind, the code, the culprit ranks and their line; ``waiting``: the live ranks in
    collectives (the culprits' counterpart in the words); ``lint_seen``: the code is lint's; ``blame``: for
    ``Kind.PAIRED``, ``blame_calls``' whole answer (with what in the history blames them, if anything)."""

    kind: Kind
    code: str | None
    ranks: tuple[int, ...]
    site: Site | None = None
    waiting: Mapping[int, Collective] = field(default_factory=dict)
    lint_seen: bool = False
    blame: Blame | None = None


def judge(src: EvidenceSource) -> Stuck:
    """The one decision on a stuck job, for every source (the module's docstring has the order)."""
    st = src.standings()
    live = {r: s for r, s in st.items() if not s.gone}
    gone = tuple(sorted(r for r, s in st.items() if s.gone))
    waiting = {r: s.call for r, s in sorted(live.items()) if s.call is not None and not s.moving}
    outside = {r: s for r, s in sorted(live.items()) if s.call is None and not s.moving}
    moving = sorted(r for r, s in live.items() if s.moving)
    if not live:
        return Stuck(Kind.NONE, None, ())
    history, lint = src.history(), tuple(src.lint())
    keys = {(c.group, c.seq, agreement(c)) for c in waiting.values()}
    if not moving and len(keys) > 1 and _one_position(waiting.values()):
        return _paired(waiting, lint, history)  # a proof: they paired calls that differ
    if not moving and waiting and outside:
        return _in_and_out(waiting, outside, lint, history, len(keys) == 1)
    if not moving and len(keys) > 1:
        return _paired(waiting, lint, history)
    if gone and waiting:
        return Stuck(Kind.GONE, "DDP204", gone, next(iter(waiting.values())).site, waiting)
    if moving:
        return Stuck(Kind.BUSY, "DDP205", tuple(moving), None, waiting)
    if waiting:
        return Stuck(Kind.TRANSPORT, "DDP205", tuple(waiting), next(iter(waiting.values())).site, waiting)
    return Stuck(Kind.IDLE, "DDP205", tuple(outside), None)


def _one_position(calls) -> bool:
    """Different collectives (op or line) at one known position (a group and its sequence number): the ranks
    there paired calls that can never match -- a proof, whoever else is elsewhere.  (Shapes alone are no proof
    here: a rank's in-flight record may lack them.)"""
    pos = {(c.group, c.seq) for c in calls}
    return len(pos) == 1 and next(iter(pos))[1] is not None and len(
        {(c.op, c.site.key() if c.site else None) for c in calls}) > 1


def _paired(waiting: dict[int, Collective], lint: tuple[LintMark, ...],
            history: Mapping[int, RankState] | None) -> Stuck:
    b = blame_calls(waiting, lint, ranks=history)
    return Stuck(Kind.PAIRED, b.code, b.ranks, b.site, waiting, b.lint_seen, b)


def _in_and_out(waiting: dict[int, Collective], outside: dict[int, Standing], lint: tuple[LintMark, ...],
                history: Mapping[int, RankState] | None, one_call: bool) -> Stuck:
    """Some ranks wait in a collective while the others are outside collectives: who holds up whom.  The facts
    that the outside ones stall first (their data, a peer outside the job, a collective they ran before and did
    not come back to), then lint's flag on the waiting ranks' line, then the history (they never ran it);
    without any of these, the cautious answer: the outside ones stall."""
    def stall(rs) -> Stuck:
        return Stuck(Kind.STALL, "DDP205", tuple(sorted(rs)), None, waiting)

    if all(s.waits_on == DATA for s in outside.values()):
        return stall(outside)
    if peer := [r for r, s in outside.items() if s.waits_on == PEER]:
        return stall(peer)
    if history is not None and (back := _ran_before(waiting, outside, history)):
        return stall(back)
    first = next(iter(waiting.values()))
    flagged = lint_code_at(lint, first.site) if one_call else None
    if flagged is None and history is None:
        return stall(outside)
    # the largest set of waiting ranks at one call: a collective the others never entered
    by: dict[tuple, list[int]] = {}
    for r, c in waiting.items():
        by.setdefault((c.group, c.seq, c.op), []).append(r)
    subset = max(by.values(), key=len)
    c = waiting[subset[0]]
    code = flagged or ("DDP202" if c.op.startswith("ddp.forward") else "DDP201")
    return Stuck(Kind.SUBSET, code, tuple(subset), c.site, waiting, lint_seen=flagged is not None)


def _ran_before(waiting: dict[int, Collective], outside: dict[int, Standing],
                history: Mapping[int, RankState]) -> list[int]:
    """The ranks outside collectives that the waiting ones wait for: they ran the collective the others wait in
    before (it is not a rank-conditional one), so it is they who did not come back to it."""
    keys = {(c.op, c.site.key() if c.site else None) for c in waiting.values()}
    return [r for r in outside if r in history and keys & history[r].sites_seen]
