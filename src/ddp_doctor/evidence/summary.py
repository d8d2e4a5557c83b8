"""Hierarchical watching: what one node's agent tells the root about its ranks, and what the root asks back.

A node's ``ddp-doctor run`` reads its own ranks' states (``RankState``, posted to a store on the node) and
reduces them to one :class:`NodeSummary` per interval: per group the positions its ranks are at, which
ranks wait in which collective and for how long, who is outside collectives and since when they last
showed a sign of life, failed and finished ranks, a desync it proved among its own ranks, and a short
digest of the fingerprints of the positions its ranks reached since its last summary (so the root can
tell two nodes' collectives apart without their fingerprints).  The root decides from the node summaries
(``diagnose.live``) and pulls the full states (:class:`NodeDetail`) only from the nodes it suspects,
through a :class:`Control` message every node reads.

On the side channel a summary travels in the compact delta encoding of :mod:`ddp_doctor.evidence.compact`;
``to_json`` / ``from_json`` here are the plain JSON of captures and tests.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ddp_doctor.evidence.job import NodeLoss, Verdict
from ddp_doctor.evidence.rank import RankState
from ddp_doctor.evidence.records import Collective, Site


def ranges(ranks) -> list[list[int]]:
    """Sorted ranks as ``[[first, last], ...]`` runs (a node's ranks are usually one run)."""
    out: list[list[int]] = []
    for r in sorted(ranks):
        if out and r == out[-1][1] + 1:
            out[-1][1] = r
        else:
            out.append([r, r])
    return out


def rank_runs(ranks) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2, 5"``: how a report names many ranks."""
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges(ranks))


def unranges(runs) -> tuple[int, ...]:
    return tuple(r for a, b in runs or () for r in range(int(a), int(b) + 1))


@dataclass(frozen=True, slots=True)
class Waiting:
    """Ranks of one node inside the same collective, issued at the same line; ``coll.waiting_s`` is the
    longest wait among them."""
    coll: Collective
    ranks: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"coll": self.coll.to_json(), "ranks": list(self.ranks)}

    @classmethod
    def from_json(cls, d) -> "Waiting":
        return cls(Collective.from_json(d["coll"]), tuple(d.get("ranks") or ()))


@dataclass(frozen=True, slots=True)
class Outside:
    """A live rank outside collectives: its line, and how long it has shown no sign of life."""
    rank: int
    where: Site | None
    idle_s: float

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "where": None if self.where is None else self.where.to_json(),
                "idle_s": self.idle_s}

    @classmethod
    def from_json(cls, d) -> "Outside":
        return cls(int(d["rank"]), Site.from_json(d.get("where")), float(d.get("idle_s") or 0.0))


@dataclass(frozen=True, slots=True)
class Finished:
    """Ranks whose program ended normally, with the number of collectives they issued per group."""
    seq: Mapping[str, int]
    ranks: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"seq": dict(self.seq), "ranks": list(self.ranks)}

    @classmethod
    def from_json(cls, d) -> "Finished":
        return cls(dict(d.get("seq") or {}), tuple(d.get("ranks") or ()))


@dataclass(frozen=True, slots=True)
class Deadline:
    """The collective of a node nearest to its process group's timeout."""
    rank: int
    coll: Collective
    timeout_s: float

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "coll": self.coll.to_json(), "timeout_s": self.timeout_s}

    @classmethod
    def from_json(cls, d) -> "Deadline | None":
        if not d:
            return None
        return cls(int(d["rank"]), Collective.from_json(d["coll"]), float(d["timeout_s"]))


@dataclass(frozen=True, slots=True)
class Digests:
    """Fingerprint digests of one group's consecutive positions ``first``, ``first + 1``, ...: per position
    the distinct codes of the node's ranks that reached it (``diagnose.summary.fp_code``; empty: none, or
    inside DDP's Join)."""
    group: str
    first: int
    codes: tuple[tuple[int, ...], ...]

    def to_json(self) -> dict[str, Any]:
        return {"group": self.group, "first": self.first, "codes": [list(c) for c in self.codes]}

    @classmethod
    def from_json(cls, d) -> "Digests":
        return cls(d["group"], int(d["first"]), tuple(tuple(int(x) for x in c) for c in d.get("codes") or ()))


@dataclass(frozen=True, slots=True)
class NodeSummary:
    """One node's ranks, reduced (see the module doc).  Ages are seconds before the summary was made."""
    node: int                          # the node's slot on the root store (0 on a single node)
    version: int = 0                   # bumped by every summary: a version that does not change = a late agent
    t: float = 0.0                     # when it was made, on its node's monotonic clock
    host: str | None = None
    attempt: int = 0                   # torch's restart count of the ranks summarised
    world_size: int | None = None      # as the ranks know it
    ranks: tuple[int, ...] = ()        # every rank that posted a state here
    live: tuple[int, ...] = ()         # of them: running (not finished, failed or exited)
    failed: tuple[int, ...] = ()       # raised, killed or exited non-zero
    finished: tuple[Finished, ...] = ()
    waiting: tuple[Waiting, ...] = ()
    outside: tuple[Outside, ...] = ()
    busy: tuple[int, ...] = ()         # live ranks that showed a sign of life in the last seconds
    progress_age_s: float | None = None  # since the newest progress of a live rank
    active_age_s: float | None = None    # since the newest sign of life of a live rank
    first_t: float | None = None         # when any rank here first posted, on the node's clock
    progress: int = 0                  # the live ranks' progress counters, summed
    deadline: Deadline | None = None
    step_p90_s: float | None = None    # p90 of the ranks' recent step times
    step_n: int = 0                    # how many step times that p90 is of
    desync: Verdict | None = None      # proven among this node's own ranks
    digests: tuple[Digests, ...] = ()  # positions reached since the previous summary (and a few before)
    # a summary of summaries (a group leader's, ``JobView.summary``): the nodes below it that it stopped
    # hearing from (lost: their ranks' last known times stand), and how many of them are late right now
    lost: tuple[NodeLoss, ...] = ()
    late: int = 0

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, tuple):
                v = [x.to_json() if hasattr(x, "to_json") else x for x in v]
            elif hasattr(v, "to_json"):
                v = v.to_json()
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NodeSummary":
        return cls(
            int(d["node"]), int(d.get("version") or 0), float(d.get("t") or 0.0), d.get("host"), int(d.get("attempt") or 0), d.get("world_size"),
            tuple(d.get("ranks") or ()), tuple(d.get("live") or ()), tuple(d.get("failed") or ()),
            tuple(Finished.from_json(x) for x in d.get("finished") or ()),
            tuple(Waiting.from_json(x) for x in d.get("waiting") or ()),
            tuple(Outside.from_json(x) for x in d.get("outside") or ()), tuple(d.get("busy") or ()),
            d.get("progress_age_s"), d.get("active_age_s"), d.get("first_t"), int(d.get("progress") or 0),
            Deadline.from_json(d.get("deadline")), d.get("step_p90_s"), int(d.get("step_n") or 0),
            Verdict.from_json(d.get("desync")), tuple(Digests.from_json(x) for x in d.get("digests") or ()),
            tuple(NodeLoss.from_json(x) for x in d.get("lost") or ()), int(d.get("late") or 0))

    def with_(self, **kw) -> "NodeSummary":
        return replace(self, **kw)

    def only(self, ranks) -> "NodeSummary":
        """This summary of ``ranks`` alone: what the root keeps of a silent group leader's last summary once a
        new leader reports the rest of its ranks (a rank is never counted twice, nor waited for twice)."""
        keep = set(ranks)

        def rs(xs):
            return tuple(r for r in xs if r in keep)

        return replace(self, ranks=rs(self.ranks), live=rs(self.live), failed=rs(self.failed), busy=rs(self.busy),
                       finished=tuple(Finished(f.seq, rs(f.ranks)) for f in self.finished if rs(f.ranks)),
                       waiting=tuple(Waiting(w.coll, rs(w.ranks)) for w in self.waiting if rs(w.ranks)),
                       outside=tuple(o for o in self.outside if o.rank in keep),
                       deadline=self.deadline if self.deadline is not None and self.deadline.rank in keep else None)


@dataclass(frozen=True, slots=True)
class Pull:
    """The root asks a node for its ranks' full states (``stacks``: take every rank's stack first).  ``ranks``:
    the ranks wanted (empty: all); a group leader asks only the nodes of its group that hold them."""
    req: int
    stacks: bool = False
    ranks: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Control:
    """The root's one message to every node agent: stop the job, or send the full states it names."""
    version: int = 0
    stop: str | None = None                          # the verdict's reason: every node stops its ranks
    pulls: Mapping[int, Pull] = field(default_factory=dict)   # node slot -> request

    def to_json(self) -> dict[str, Any]:
        return {"version": self.version, "stop": self.stop,
                "pulls": {str(n): [p.req, int(p.stacks), ranges(p.ranks)] for n, p in self.pulls.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Control | None":
        if not isinstance(d, Mapping):
            return None
        return cls(int(d.get("version") or 0), d.get("stop"),
                   {int(n): Pull(int(p[0]), bool(p[1]), unranges(p[2] if len(p) > 2 else ()))
                    for n, p in (d.get("pulls") or {}).items()})


@dataclass(frozen=True, slots=True)
class NodeDetail:
    """A node's answer to a :class:`Pull` (or its last word at the end of the job, ``req`` 0): the full
    state of each of its ranks, with what its agent added (stacks, exit status, signs of life)."""
    node: int
    req: int
    host: str | None = None
    ranks: tuple[RankState, ...] = ()
    final: bool = False                 # the node's ranks have ended
    t0: float | None = None             # the wall-clock start its ranks' times (``RankState.t``) count from

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "req": self.req, "host": self.host, "final": self.final, "t0": self.t0,
                "ranks": [st.to_json() for st in self.ranks]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NodeDetail":
        return cls(int(d["node"]), int(d.get("req") or 0), d.get("host"),
                   tuple(RankState.from_json(x) for x in d.get("ranks") or ()), bool(d.get("final")), d.get("t0"))
