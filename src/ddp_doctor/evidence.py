"""The typed runtime evidence: what a rank's probe publishes, what the watcher adds, what diagnose reads.

These frozen records ARE the wire format.  The probe builds a :class:`RankState` at publish time (its
hot path keeps tuples) and sends ``to_json()``; the watcher reads it back with ``RankState.from_json``,
adds what only the launcher side knows (stacks, exit status, busy, the sites a rank ever ran) and
hands a :class:`JobEvidence` plus the live :class:`Verdict` to ``diagnose``; the session renders the
records into the user-facing ``ddp-doctor/report/v1`` document with ``to_json()``.  No other module
knows a key of this format: a key written here and read elsewhere under another name (the bug this
module was made for: ``shapes`` published, ``shape`` rendered) cannot happen.

Wire details kept compact (published 4x a second): collective fingerprints and per-site call counts
reference a shared ``sites`` table by index.  ``SCHEMA`` is posted with every state; a state of
another schema is ignored by the watcher rather than misread.

``RankState.perf`` holds the performance family's records (``loads``, ``cuda``, ``gpu``, ``h2d``,
``loadavg``, ``cpu_count``): written by ``probe/perf.py``, read by ``diagnose/perf.py`` only.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

SCHEMA = "ddp-doctor/evidence/v1"
PERF_KEYS = ("loads", "cuda", "gpu", "h2d", "loadavg", "cpu_count")


def _tuple(xs) -> tuple:
    return tuple(xs) if xs else ()


# -- small records -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Site:
    """A source line: a call site, a stack frame, where a rank is."""
    path: str
    line: int
    function: str | None = None

    def key(self) -> tuple:
        """Sites compare by file name, line and function (paths differ between nodes)."""
        return (os.path.basename(self.path), self.line, self.function)

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "function": self.function}

    @classmethod
    def from_json(cls, d) -> "Site | None":
        if not d:
            return None
        if isinstance(d, Site):
            return d
        if isinstance(d, (list, tuple)):
            return cls(d[0], int(d[1] or 0), d[2] if len(d) > 2 else None)
        return cls(d["path"], int(d.get("line") or 0), d.get("function"))


def _site_json(s: Site | None):
    return None if s is None else s.to_json()


def _sites(xs) -> tuple[Site, ...]:
    return tuple(s for s in (Site.from_json(x) for x in xs or ()) if s is not None)


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call of a rank: its position (group, seq), what it is, where it was issued.

    ``waiting_s``: seconds since it was issued, for a call not completed yet; ``epoch`` /
    ``step_in_epoch``: the training position it was issued at (fingerprints)."""
    group: str | None
    seq: int | None
    op: str
    shapes: tuple[str, ...] = ()
    dtypes: tuple[str, ...] = ()
    site: Site | None = None
    origin: str | None = None
    waiting_s: float | None = None
    epoch: int | None = None
    step_in_epoch: int | None = None

    def signature(self) -> tuple:
        return (self.op, self.shapes, self.dtypes)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"group": self.group, "seq": self.seq, "op": self.op, "shapes": list(self.shapes),
                             "dtypes": list(self.dtypes), "site": _site_json(self.site)}
        for k in ("origin", "waiting_s", "epoch", "step_in_epoch"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        return d

    @classmethod
    def from_json(cls, d) -> "Collective | None":
        if not d:
            return None
        if isinstance(d, Collective):
            return d
        return cls(d.get("group"), d.get("seq"), d["op"], tuple(d.get("shapes") or ()), tuple(d.get("dtypes") or ()),
                   Site.from_json(d.get("site")), d.get("origin"), d.get("waiting_s"), d.get("epoch"),
                   d.get("step_in_epoch"))


@dataclass(frozen=True, slots=True)
class ExitStatus:
    """How a rank's process ended: an exit code, or the signal that killed it (exit_code -N)."""
    exit_code: int | None = None
    signal: str | None = None

    @property
    def failed(self) -> bool:
        return bool(self.signal) or self.exit_code not in (None, 0)

    @property
    def killed(self) -> bool:
        """Killed by a signal other than the SIGTERM of a stop."""
        return self.signal not in (None, "SIGTERM")

    def to_json(self) -> dict[str, Any]:
        return {"exit_code": self.exit_code, "signal": self.signal}

    @classmethod
    def from_json(cls, d) -> "ExitStatus | None":
        if not d:
            return None
        return d if isinstance(d, ExitStatus) else cls(d.get("exit_code"), d.get("signal"))


@dataclass(frozen=True, slots=True)
class RaisedError:
    """The exception that ended a rank (or a SystemExit's location): innermost user frame, traceback."""
    type: str
    message: str = ""
    module: str | None = None
    location: Site | None = None
    traceback: tuple[Site, ...] = ()
    in_collective: bool = False
    collective: Collective | None = None   # the collective it escaped from, if any
    t: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "module": self.module, "message": self.message,
                "location": _site_json(self.location), "traceback": [s.to_json() for s in self.traceback],
                "in_collective": self.in_collective,
                "collective": None if self.collective is None else self.collective.to_json(), "t": self.t}

    @classmethod
    def from_json(cls, d) -> "RaisedError | None":
        if not d:
            return None
        if isinstance(d, RaisedError):
            return d
        return cls(d.get("type") or "Exception", d.get("message") or "", d.get("module"),
                   Site.from_json(d.get("location")), _sites(d.get("traceback")), bool(d.get("in_collective")),
                   Collective.from_json(d.get("collective")), d.get("t"))


@dataclass(frozen=True, slots=True)
class DataWait:
    """A rank blocked in ``next()`` of a DataLoader (index into ``RankState.loaders``)."""
    loader: int | None
    waiting_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"loader": self.loader, "waiting_s": self.waiting_s}

    @classmethod
    def from_json(cls, d) -> "DataWait | None":
        return cls(d.get("loader"), d.get("waiting_s") or 0.0) if d else None


@dataclass(frozen=True, slots=True)
class SamplerState:
    type: str
    epoch: int | None = None
    shuffle: bool | None = None
    drop_last: bool | None = None
    num_samples: int | None = None
    set_epoch_calls: int = 0
    epochs_seen: tuple = ()

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "epoch": self.epoch, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "num_samples": self.num_samples, "set_epoch_calls": self.set_epoch_calls,
                "epochs_seen": list(self.epochs_seen)}

    @classmethod
    def from_json(cls, d) -> "SamplerState | None":
        if not d:
            return None
        return cls(d.get("type") or "?", d.get("epoch"), d.get("shuffle"), d.get("drop_last"), d.get("num_samples"),
                   d.get("set_epoch_calls") or 0, _tuple(d.get("epochs_seen")))


@dataclass(frozen=True, slots=True)
class LoaderState:
    """One DataLoader of a rank: where it was built, its settings, what iterating it measured."""
    site: Site | None = None
    len: int | None = None
    num_workers: int | None = None
    pin_memory: bool | None = None
    persistent_workers: bool | None = None
    prefetch_factor: int | None = None
    batch_size: int | None = None
    epochs: int = 0
    batches: int = 0
    data_wait_s: float = 0.0
    epoch_start_s: tuple[float, ...] = ()
    batch_wait_s: tuple[float, ...] = ()
    steps_by_epoch: tuple[int, ...] = ()
    batches_by_epoch: tuple[int, ...] = ()
    skips_by_epoch: tuple[int, ...] = ()
    sampler: SamplerState | None = None
    worker_pids: tuple[int, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = _site_json(v) if f.name == "site" else v.to_json() if f.name == "sampler" and v else \
                list(v) if isinstance(v, tuple) else v
        return d

    @classmethod
    def from_json(cls, d) -> "LoaderState":
        kw = {f.name: d.get(f.name) for f in fields(cls) if f.name in d}
        kw["site"] = Site.from_json(d.get("site"))
        kw["sampler"] = SamplerState.from_json(d.get("sampler"))
        for k in ("epoch_start_s", "batch_wait_s", "steps_by_epoch", "batches_by_epoch", "skips_by_epoch", "worker_pids"):
            kw[k] = _tuple(d.get(k))
        for k in ("epochs", "batches"):
            kw[k] = kw.get(k) or 0
        kw["data_wait_s"] = kw.get("data_wait_s") or 0.0
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class DdpModel:
    """One DistributedDataParallel construction of a rank."""
    site: Site | None = None
    find_unused_parameters: bool = False
    broadcast_buffers: bool = False
    buffers: int = 0
    params: int = 0
    unused_seen: bool | None = None
    unused_parameter_size: int | None = None

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["site"] = _site_json(self.site)
        if self.unused_parameter_size is None:
            del d["unused_parameter_size"]
        return d

    @classmethod
    def from_json(cls, d) -> "DdpModel":
        kw = {f.name: d[f.name] for f in fields(cls) if d.get(f.name) is not None}
        kw["site"] = Site.from_json(d.get("site"))
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class Timing:
    """Where a rank's step time went (seconds, steps after the first)."""
    steps: int = 0
    step_time_s: float = 0.0
    step_time_last200_s: float = 0.0
    data_wait_s: float = 0.0
    collective_s: float = 0.0
    compute_s: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d) -> "Timing | None":
        if not d:
            return None
        return cls(**{f.name: d[f.name] for f in fields(cls) if d.get(f.name) is not None})


@dataclass(frozen=True, slots=True)
class TimelineEvent:
    """One span of a rank's timeline: kind step | collective | data_wait | h2d | epoch."""
    t: float
    kind: str
    dur: float
    label: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "kind": self.kind, "dur": self.dur, "label": self.label}

    @classmethod
    def from_json(cls, d) -> "TimelineEvent":
        return cls(d.get("t") or 0.0, d.get("kind") or "", d.get("dur") or 0.0, d.get("label"))


@dataclass(frozen=True, slots=True)
class ThreadStack:
    name: str
    main: bool
    frames: tuple[Site, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "main": self.main, "frames": [f.to_json() for f in self.frames]}

    @classmethod
    def from_json(cls, d) -> "ThreadStack":
        return cls(str(d.get("name")), bool(d.get("main")), _sites(d.get("frames")))


def stacks_to_json(threads) -> dict[str, Any]:
    """A probe's answer to a stack request."""
    return {"schema": SCHEMA, "threads": [t.to_json() for t in threads]}


def stacks_from_json(d) -> tuple[ThreadStack, ...]:
    return tuple(ThreadStack.from_json(t) for t in (d or {}).get("threads") or ())


@dataclass(frozen=True, slots=True)
class WorkerStack:
    """A DataLoader worker process of a rank and its stack (faulthandler)."""
    pid: int
    stack: tuple[Site, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "stack": [f.to_json() for f in self.stack]}

    @classmethod
    def from_json(cls, d) -> "WorkerStack":
        return cls(int(d["pid"]), _sites(d.get("stack")))


@dataclass(frozen=True, slots=True)
class SiteCount:
    """How many times a rank issued ``op`` at ``site``."""
    op: str
    site: Site | None
    calls: int


# -- the rank ------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class RankState:
    """Everything known about one rank: what its probe published, plus (launcher side) stacks and exit."""
    rank: int
    missing: bool = False            # never published (did not start the probe)
    local_rank: int | None = None
    host: str | None = None
    pid: int | None = None
    attempt: int = 0                 # torch's restart count of the rank's worker group
    agent_store: bool = False        # process-group keys live in the agent's (long-lived) store
    world_size: int | None = None
    t: float | None = None
    epoch: int | None = None
    step: int = 0                    # optimizer steps
    step_in_epoch: int | None = None
    forwards: int = 0                # DDP forward calls
    backwards: int = 0
    progress: int = 0                # bumped by every step and completed collective
    steps_by_epoch: tuple[int, ...] = ()
    train_loader: int | None = None  # index into loaders
    step_times: tuple[float, ...] = ()
    cpu_s: float = 0.0
    where: Site | None = None        # the main thread's innermost user line at publish time
    in_collective: Collective | None = None
    last_collective: Collective | None = None
    in_data_wait: DataWait | None = None
    seq: Mapping[str, int] = field(default_factory=dict)
    fingerprints: tuple[Collective, ...] = ()
    site_counts: tuple[SiteCount, ...] = ()
    timing: Timing | None = None
    coll_count: int = 0
    coll_time_s: float = 0.0
    loaders: tuple[LoaderState, ...] = ()
    ddp: tuple[DdpModel, ...] = ()
    exc: RaisedError | None = None
    done: bool = False               # the rank's program returned
    exit_code: int | None = None     # the program's own exit code (probe side)
    exit_site: Site | None = None    # where sys.exit() was called
    timeline: tuple[TimelineEvent, ...] | None = None  # only in full (final / on request) states
    perf: Mapping[str, Any] = field(default_factory=dict)
    # launcher side
    stack: tuple[Site, ...] = ()
    threads: tuple[ThreadStack, ...] = ()
    workers: tuple[WorkerStack, ...] = ()
    exit: ExitStatus | None = None
    busy: bool = False
    stalled_s: float | None = None
    sites_seen: frozenset = frozenset()  # {(op, site key)} of every call the rank ever made
    fatal_stack: bool = False

    # -- what diagnosis asks of a rank -------------------------------------------------------
    @property
    def failed(self) -> bool:
        """Raised, was killed or exited non-zero."""
        return self.exc is not None or (self.exit is not None and self.exit.failed)

    @property
    def finished(self) -> bool:
        """Its program ended normally."""
        return self.done or (self.exit is not None and self.exit.exit_code == 0)

    @property
    def signal(self) -> str | None:
        return self.exit.signal if self.exit else None

    def train_loader_state(self) -> LoaderState | None:
        tl = self.train_loader
        return self.loaders[tl] if tl is not None and 0 <= tl < len(self.loaders) else None

    # -- wire ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        table: dict[Site, int] = {}

        def idx(s: Site | None):
            if s is None:
                return None
            i = table.get(s)
            if i is None:
                i = table[s] = len(table)
            return i

        d: dict[str, Any] = {"schema": SCHEMA}
        for f in fields(self):
            k, v = f.name, getattr(self, f.name)
            if k in ("fingerprints", "site_counts", "perf", "sites_seen", "coll_count", "coll_time_s"):
                continue
            if v is None or isinstance(v, (str, int, float, bool)):
                d[k] = v
            elif isinstance(v, tuple):
                d[k] = [x.to_json() if hasattr(x, "to_json") else x for x in v]
            elif isinstance(v, Mapping):
                d[k] = dict(v)
            else:
                d[k] = v.to_json()
        d["fingerprints"] = [[c.group, c.seq, c.op, list(c.shapes), list(c.dtypes), idx(c.site), c.epoch,
                              c.step_in_epoch] for c in self.fingerprints]
        d["site_counts"] = [[sc.op, idx(sc.site), sc.calls] for sc in self.site_counts]
        d["sites"] = [[s.path, s.line, s.function] for s in table]
        d["collectives"] = {"count": self.coll_count, "time_s": self.coll_time_s}
        d["sites_seen"] = [[op, list(k) if k else None] for op, k in sorted(self.sites_seen, key=str)]
        d.update(self.perf)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "RankState":
        sites = [Site.from_json(s) for s in d.get("sites") or ()]

        def at(i):
            return sites[i] if i is not None and 0 <= i < len(sites) else None

        tl = d.get("timeline")
        colls = d.get("collectives") or {}
        return cls(
            rank=int(d["rank"]), missing=bool(d.get("missing")), local_rank=d.get("local_rank"), host=d.get("host"),
            pid=d.get("pid"), attempt=int(d.get("attempt") or 0), agent_store=bool(d.get("agent_store")),
            world_size=d.get("world_size"), t=d.get("t"), epoch=d.get("epoch"), step=d.get("step") or 0,
            step_in_epoch=d.get("step_in_epoch"), forwards=d.get("forwards") or 0, backwards=d.get("backwards") or 0,
            progress=d.get("progress") or 0, steps_by_epoch=_tuple(d.get("steps_by_epoch")),
            train_loader=d.get("train_loader"), step_times=_tuple(d.get("step_times")), cpu_s=d.get("cpu_s") or 0.0,
            where=Site.from_json(d.get("where")), in_collective=Collective.from_json(d.get("in_collective")),
            last_collective=Collective.from_json(d.get("last_collective")),
            in_data_wait=DataWait.from_json(d.get("in_data_wait")), seq=dict(d.get("seq") or {}),
            fingerprints=tuple(Collective(g, s, op, tuple(sh), tuple(dt), at(si), None, None, ep, st)
                               for g, s, op, sh, dt, si, ep, st in d.get("fingerprints") or ()),
            site_counts=tuple(SiteCount(op, at(si), n) for op, si, n in d.get("site_counts") or ()),
            timing=Timing.from_json(d.get("timing")), coll_count=colls.get("count") or 0,
            coll_time_s=colls.get("time_s") or 0.0,
            loaders=tuple(LoaderState.from_json(ld) for ld in d.get("loaders") or ()),
            ddp=tuple(DdpModel.from_json(x) for x in d.get("ddp") or ()), exc=RaisedError.from_json(d.get("exc")),
            done=bool(d.get("done")), exit_code=d.get("exit_code"), exit_site=Site.from_json(d.get("exit_site")),
            timeline=None if tl is None else tuple(TimelineEvent.from_json(e) for e in tl),
            perf={k: d[k] for k in PERF_KEYS if k in d},
            stack=_sites(d.get("stack")), threads=tuple(ThreadStack.from_json(t) for t in d.get("threads") or ()),
            workers=tuple(WorkerStack.from_json(w) for w in d.get("workers") or ()),
            exit=ExitStatus.from_json(d.get("exit")), busy=bool(d.get("busy")), stalled_s=d.get("stalled_s"),
            sites_seen=frozenset((op, tuple(k) if k else None) for op, k in d.get("sites_seen") or ()),
            fatal_stack=bool(d.get("fatal_stack")))

    def with_(self, **kw) -> "RankState":
        return replace(self, **kw)


def missing_rank(rank: int) -> RankState:
    return RankState(rank=rank, missing=True)


# -- the job -------------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class LintMark:
    """A static finding of the user's script, as the runtime uses it: code and line."""
    code: str
    path: str
    line: int

    def to_json(self) -> dict[str, Any]:
        return {"code": self.code, "path": self.path, "line": self.line}


@dataclass(frozen=True, slots=True)
class JobEvidence:
    """Every rank's state at the end of watching, plus what the watcher and the linter knew."""
    world_size: int
    ranks: Mapping[int, RankState]
    wall_s: float | None = None
    hang_limit_s: float | None = None
    hang_limit_how: str | None = None
    lint: tuple[LintMark, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"schema": SCHEMA, "world_size": self.world_size, "wall_s": self.wall_s,
                "ranks": {r: st.to_json() for r, st in self.ranks.items()}, "hang_limit_s": self.hang_limit_s,
                "hang_limit_how": self.hang_limit_how, "lint": [m.to_json() for m in self.lint]}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "JobEvidence":
        ranks = {int(r): RankState.from_json({"rank": r, **st}) for r, st in (d.get("ranks") or {}).items()}
        return cls(d.get("world_size") or len(ranks), ranks, d.get("wall_s"), d.get("hang_limit_s"),
                   d.get("hang_limit_how"),
                   tuple(LintMark(m["code"], m["path"], int(m["line"])) for m in d.get("lint") or ()))

    def with_(self, **kw) -> "JobEvidence":
        return replace(self, **kw)


@dataclass(frozen=True, slots=True)
class Verdict:
    """The watcher's live decision: why it stopped looking (``reason`` exit | desync | hang).

    desync: ``kind`` op | shape | site | steps, at (``group``, ``seq``) with each rank's ``calls``, or
    per-epoch ``steps`` that differ in ``epoch``; exit: ``rank`` (``finished`` when it ended normally
    while the others wait); hang: ``stalled_s`` against ``limit_s`` (``limit_how``), ``busy`` ranks.
    Fixed at the decision: ``failed`` (a rank had failed), ``blocked`` (the ranks still wait at the
    mismatch), ``attempt``; ``t_detect`` / ``t_stacks`` time the detection (monotonic clock)."""
    reason: str
    kind: str | None = None
    group: str | None = None
    seq: int | None = None
    calls: Mapping[int, Collective] = field(default_factory=dict)
    epoch: int | None = None
    steps: Mapping[int, int] = field(default_factory=dict)
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
            if f.name == "calls":
                v = {str(r): c.to_json() for r, c in v.items()}
            elif f.name == "steps":
                v = {str(r): n for r, n in v.items()}
            elif isinstance(v, tuple):
                v = list(v)
            d[f.name] = v
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "Verdict | None":
        if not d:
            return None
        kw = {f.name: d[f.name] for f in fields(cls) if f.name in d}
        kw["calls"] = {int(r): Collective.from_json(c) for r, c in (d.get("calls") or {}).items()}
        kw["steps"] = {int(r): n for r, n in (d.get("steps") or {}).items()}
        kw["busy"] = _tuple(d.get("busy"))
        return cls(**kw)


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
