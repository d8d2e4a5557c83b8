"""The job's evidence, the watcher's live verdict, a saved capture, and the side channel's text."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ddp_doctor.evidence.outside import Stall
from ddp_doctor.evidence.rank import RankState
from ddp_doctor.evidence.records import SCHEMA, Collective, ExitStatus, Site, _tuple
from ddp_doctor.evidence.threads import ThreadStack, stacks_from_json


# -- the job -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class NodeLoss:
    """A node agent the root stopped hearing from (several nodes): its ranks went unwatched from then on."""
    node: int
    host: str | None
    ranks: tuple[int, ...]
    silent_s: float                     # how long its summaries had stopped when it was declared lost

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "host": self.host, "ranks": list(self.ranks), "silent_s": self.silent_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "NodeLoss":
        return cls(int(d["node"]), d.get("host"), tuple(d.get("ranks") or ()), float(d.get("silent_s") or 0.0))


@dataclass(frozen=True, slots=True)
class LintMark:
    """A static finding of the user's script, as the runtime uses it: code and line, and ``cause``: the
    line that makes it one when it is elsewhere (the early ``return`` in a helper the loop calls)."""
    code: str
    path: str
    line: int
    cause: Site | None = None

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"code": self.code, "path": self.path, "line": self.line}
        if self.cause is not None:
            d["cause"] = self.cause.to_json()
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "LintMark":
        return cls(d["code"], d["path"], int(d["line"]), Site.from_json(d.get("cause")))


@dataclass(frozen=True, slots=True)
class JobEvidence:
    """Every rank's state at the end of watching, plus what the watcher and the linter knew."""
    world_size: int
    ranks: Mapping[int, RankState]
    wall_s: float | None = None
    hang_limit_s: float | None = None
    hang_limit_how: str | None = None
    lint: tuple[LintMark, ...] = ()
    suspicion: "Suspicion | None" = None  # the longest a rank outside collectives kept others waiting
    lost_nodes: tuple[NodeLoss, ...] = ()  # node agents that went silent (several nodes)
    stalls: tuple[Stall, ...] = ()  # stalls diagnosed while the job ran (the last one still on when lasted_s is None)

    def to_json(self) -> dict[str, Any]:
        d = {"schema": SCHEMA, "world_size": self.world_size, "wall_s": self.wall_s,
             "ranks": {r: st.to_json() for r, st in self.ranks.items()}, "hang_limit_s": self.hang_limit_s,
             "hang_limit_how": self.hang_limit_how, "lint": [m.to_json() for m in self.lint]}
        if self.suspicion is not None:
            d["suspicion"] = self.suspicion.to_json()
        if self.lost_nodes:
            d["lost_nodes"] = [n.to_json() for n in self.lost_nodes]
        if self.stalls:
            d["stalls"] = [s.to_json() for s in self.stalls]
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobEvidence":
        ranks = {int(r): RankState.from_json({"rank": r, **st}) for r, st in (d.get("ranks") or {}).items()}
        return cls(d.get("world_size") or len(ranks), ranks, d.get("wall_s"), d.get("hang_limit_s"),
                   d.get("hang_limit_how"),
                   tuple(LintMark.from_json(m) for m in d.get("lint") or ()),
                   Suspicion.from_json(d.get("suspicion")),
                   tuple(NodeLoss.from_json(n) for n in d.get("lost_nodes") or ()),
                   tuple(Stall.from_json(x) for x in d.get("stalls") or ()))

    def with_(self, **kw) -> "JobEvidence":
        return replace(self, **kw)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The watcher's live decision: why it stopped looking (``reason`` exit | desync | hang), or an event that
    stops nothing (``stalled``: no rank showed a sign of life for the limit, diagnosed while the job runs on;
    ``resumed``: a rank moved again, ``stalled_s`` how long the stall lasted).

    desync: ``kind`` op | shape, at (``group``, ``seq``) with each rank's ``calls`` (and ``parted``: each
    rank's call at the first earlier position where they came from different training positions or lines,
    an explanation, never a proof), or ``cycle`` (two ranks blocked in collectives of
    different groups, each waiting for the other: ``calls`` holds both); exit: ``rank`` (``finished`` when it ended normally
    while the others wait); hang: ``stalled_s`` against ``limit_s`` (``limit_how``), ``busy`` ranks,
    ``kind`` "pg-timeout" when a collective had waited almost the process group's own timeout, "frozen-workers"
    when a stall's facts proved a rank can never get its next batch (``live.stall_proof``).
    Fixed at the decision: ``failed`` (a rank had failed), ``blocked`` (the ranks still wait at the
    mismatch), ``attempt``; ``t_detect`` / ``t_stacks`` time the detection (monotonic clock)."""
    reason: str
    kind: str | None = None
    group: str | None = None
    seq: int | None = None
    calls: Mapping[int, Collective] = field(default_factory=dict)
    parted: Mapping[int, Collective] = field(default_factory=dict)
    rank: int | None = None
    finished: bool = False
    stalled_s: float | None = None
    limit_s: float | None = None
    limit_how: str | None = None
    busy: tuple[int, ...] = ()
    failed: bool | None = None
    blocked: bool | None = None
    attempt: int | None = None
    t_detect: float | None = None
    t_stacks: float | None = None

    def with_(self, **kw) -> "Verdict":
        return replace(self, **kw)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name in ("calls", "parted"):
                v = {str(r): c.to_json() for r, c in v.items()}
            elif isinstance(v, tuple):
                v = list(v)
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Verdict | None":
        if not d:
            return None
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        for name in ("calls", "parted"):
            kw[name] = {int(r): Collective.from_json(c) for r, c in (d.get(name) or {}).items()}
        kw["busy"] = _tuple(d.get("busy"))
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class Suspicion:
    """The live warning while no rank progresses but nothing is proven: who waits in which collective,
    who is outside collectives (where, and for how long without any sign of life), since when.
    It never stops the job by itself; it stops one only once no rank has shown a sign of life for the
    limit (``Verdict`` hang)."""
    stalled_s: float
    waiting: Mapping[int, Collective] = field(default_factory=dict)
    outside: Mapping[int, "Site | None"] = field(default_factory=dict)
    idle_s: Mapping[int, float] = field(default_factory=dict)
    limit_s: float | None = None

    def key(self) -> tuple:
        """What the warning says, without the clock: a changed key is a new warning."""
        return (tuple(sorted((r, c.group, c.seq, c.op) for r, c in self.waiting.items())),
                tuple(sorted((r, s.key() if s else None) for r, s in self.outside.items())))

    def to_json(self) -> dict[str, Any]:
        return {"stalled_s": self.stalled_s, "waiting": {str(r): c.to_json() for r, c in self.waiting.items()},
                "outside": {str(r): None if s is None else s.to_json() for r, s in self.outside.items()},
                "idle_s": {str(r): v for r, v in self.idle_s.items()}, "limit_s": self.limit_s}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Suspicion | None":
        if not d:
            return None
        return cls(d.get("stalled_s") or 0.0, {int(r): Collective.from_json(c) for r, c in (d.get("waiting") or {}).items()},
                   {int(r): Site.from_json(s) for r, s in (d.get("outside") or {}).items()},
                   {int(r): v for r, v in (d.get("idle_s") or {}).items()}, d.get("limit_s"))


# -- the side channel's text ---------------------------------------------------------------------
def to_wire(record) -> str:
    """A record as the compact JSON text posted on the side channel."""
    return json.dumps(record.to_json(), separators=(",", ":"), default=str)


def rank_state_from_wire(raw: str) -> RankState | None:
    """A rank's posted state; None for text that is not a state of this schema (never misread)."""
    try:
        d = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(d, dict) or d.get("schema") != SCHEMA:
        return None
    return RankState.from_json(d)


def exit_from_wire(raw: str) -> ExitStatus | None:
    try:
        return ExitStatus.from_json(json.loads(raw))
    except (ValueError, AttributeError):
        return None


def stacks_from_wire(raw: str) -> tuple[ThreadStack, ...]:
    try:
        return stacks_from_json(json.loads(raw))
    except (ValueError, AttributeError):
        return ()


EVIDENCE_OUT_ENV = "DDP_DOCTOR_EVIDENCE_OUT"


@dataclass(frozen=True, slots=True)
class Capture:
    """Everything one diagnosis rests on: the evidence, the live verdict, the launcher's exit statuses.
    Saved by a run with ``DDP_DOCTOR_EVIDENCE_OUT``; ``diagnose(*capture.args())`` replays it."""
    evidence: JobEvidence
    decision: Verdict | None = None
    failures: Mapping[int, ExitStatus] = field(default_factory=dict)

    def args(self) -> tuple:
        return self.evidence, self.decision, dict(self.failures)

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "evidence": self.evidence.to_json(),
                "decision": None if self.decision is None else self.decision.to_json(),
                "failures": {str(r): x.to_json() for r, x in self.failures.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Capture":
        return cls(JobEvidence.from_json(d["evidence"]), Verdict.from_json(d.get("decision")),
                   {int(r): ExitStatus.from_json(x) for r, x in (d.get("failures") or {}).items()})
