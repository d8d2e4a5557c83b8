"""One rank's state: what its probe publishes (compact on the wire: fingerprints and per-site counts
point into a shared ``sites`` table) plus what the launcher side adds (stacks, exit status, busy)."""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ddp_doctor.evidence.records import (SCHEMA, Activity, Collective, DataWait, DdpModel, ExitStatus, GroupInit,
                                         LoaderState, Microbatches, RaisedError, Refused, SkippedSync, Site, SiteCount, TimelineEvent, Timing,
                                         _sites, _tuple)
from ddp_doctor.evidence.outside import OutsideWait
from ddp_doctor.evidence.threads import ThreadStack, WorkerStack

PERF_KEYS = ("loads", "cuda", "gpu", "h2d", "loadavg", "cpu_count")


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
    world_size: int | None = None    # the launcher's WORLD_SIZE
    group: GroupInit | None = None   # the default process group the rank joined (None: none seen yet)
    t: float | None = None
    epoch: int | None = None
    step: int = 0                    # optimizer steps
    step_in_epoch: int | None = None
    forwards: int = 0                # DDP forward calls
    backwards: int = 0
    sync_forwards: int = 0           # DDP forwards that prepared a gradient sync
    syncs_skipped: int = 0           # ... and were followed by no backward (skipped_syncs: the first few)
    skipped_syncs: tuple[SkippedSync, ...] = ()
    progress: int = 0                # bumped by every step and completed collective
    steps_by_epoch: tuple[int, ...] = ()
    train_loader: int | None = None  # index into loaders
    step_times: tuple[float, ...] = ()
    cpu_s: float = 0.0
    activity: Activity | None = None  # signs of life of the training thread and the loader workers
    pg_timeout_s: float | None = None  # the default process group's timeout (a collective waits that long)
    where: Site | None = None        # the main thread's innermost user line at publish time
    in_collective: Collective | None = None
    last_collective: Collective | None = None
    in_data_wait: DataWait | None = None
    seq: Mapping[str, int] = field(default_factory=dict)
    fingerprints: tuple[Collective, ...] = ()
    site_counts: tuple[SiteCount, ...] = ()
    not_member: tuple[SiteCount, ...] = ()  # calls on a group the rank is not in (no-ops in torch), per line
    mesh_dims: Mapping[str, str] = field(default_factory=dict)  # group key -> its DeviceMesh dimension name
    microbatches: tuple[Microbatches, ...] = ()  # each pipeline schedule's split, where the rank ran its step
    timing: Timing | None = None
    coll_count: int = 0
    coll_time_s: float = 0.0
    loaders: tuple[LoaderState, ...] = ()
    ddp: tuple[DdpModel, ...] = ()
    exc: RaisedError | None = None
    done: bool = False               # the rank's program returned
    teardown: bool = False           # it called destroy_process_group() (its training is over)
    exit_code: int | None = None     # the program's own exit code (probe side)
    exit_site: Site | None = None    # where sys.exit() was called
    exit_stack: tuple[Site, ...] = ()  # the user frames it was called through, outermost first
    timeline: tuple[TimelineEvent, ...] | None = None  # only in full (final / on request) states
    perf: Mapping[str, Any] = field(default_factory=dict)
    refused: tuple[Refused, ...] = ()  # side-channel values this rank's probe dropped (a forged stop)
    # launcher side
    stack: tuple[Site, ...] = ()
    threads: tuple[ThreadStack, ...] = ()
    workers: tuple[WorkerStack, ...] = ()
    exit: ExitStatus | None = None
    busy: bool = False
    stalled_s: float | None = None
    idle_s: float | None = None      # seconds since any sign of life (progress, CPU, I/O, stack)
    outside: OutsideWait | None = None  # the system call its training thread is blocked in, and on what
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

    def lines_seen(self) -> frozenset:
        """The site keys (file, line, function) of every line the rank ever issued a collective at, whatever op."""
        return frozenset(k for _op, k in self.sites_seen)

    def join_epochs(self) -> frozenset[int]:
        """Training epochs this rank ran (partly) inside DDP's Join, where step counts may differ."""
        tl = self.train_loader_state()
        return frozenset(tl.join_epochs) if tl is not None else frozenset()

    # -- wire ---------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        # the sites table, keyed by object identity: the probe shares one Site object per call site, so
        # this costs an int hash per fingerprint (a Site equal to another only adds a duplicate entry)
        table: dict[int, int] = {}
        sites: list[Site] = []

        def idx(s: Site | None):
            if s is None:
                return None
            i = table.get(id(s))
            if i is None:
                i = table[id(s)] = len(sites)
                sites.append(s)
            return i

        d: dict[str, Any] = {"schema": SCHEMA}
        for k in _PLAIN_FIELDS:
            v = getattr(self, k)
            if not v and k in _OMIT_WHEN_NONE:
                continue
            if v is None or isinstance(v, (str, int, float, bool)):
                d[k] = v
            elif isinstance(v, tuple):  # of records, or of numbers (step times: no per-item test)
                d[k] = [x.to_json() for x in v] if v and hasattr(v[0], "to_json") else list(v)
            elif isinstance(v, Mapping):
                d[k] = dict(v)
            else:
                d[k] = v.to_json()
        d["fingerprints"] = [[c.group, c.seq, c.op, list(c.shapes), list(c.dtypes), idx(c.site), c.epoch,
                              c.step_in_epoch, *((1,) if c.join else ())] for c in self.fingerprints]
        d["site_counts"] = [[sc.op, idx(sc.site), sc.calls] for sc in self.site_counts]
        if self.not_member:
            d["not_member"] = [[sc.op, idx(sc.site), sc.calls] for sc in self.not_member]
        d["sites"] = [s.to_list() for s in sites]
        d["collectives"] = {"count": self.coll_count, "time_s": self.coll_time_s}
        d["sites_seen"] = [[op, list(k) if k else None] for op, k in sorted(self.sites_seen, key=str)]
        if self.group is not None:
            d["group"] = self.group.to_json()
        d.update(self.perf)
        return d

    @classmethod
    def from_json(cls, d: Mapping[str, Any], fingerprints: tuple | None = None) -> "RankState":
        """(``fingerprints``: the ring, already decoded -- ``compact.StateDecoder``'s deltas.)"""
        sites = [Site.from_json(s) for s in d.get("sites") or ()]

        def at(i):
            return sites[i] if i is not None and 0 <= i < len(sites) else None

        tl = d.get("timeline")
        colls = d.get("collectives") or {}
        return cls(
            rank=int(d["rank"]), missing=bool(d.get("missing")), local_rank=d.get("local_rank"), host=d.get("host"),
            pid=d.get("pid"), attempt=int(d.get("attempt") or 0), agent_store=bool(d.get("agent_store")),
            world_size=d.get("world_size"), group=GroupInit.from_json(d.get("group")), t=d.get("t"),
            epoch=d.get("epoch"), step=d.get("step") or 0,
            step_in_epoch=d.get("step_in_epoch"), forwards=d.get("forwards") or 0, backwards=d.get("backwards") or 0,
            progress=d.get("progress") or 0, steps_by_epoch=_tuple(d.get("steps_by_epoch")),
            train_loader=d.get("train_loader"), step_times=_tuple(d.get("step_times")), cpu_s=d.get("cpu_s") or 0.0,
            activity=Activity.from_json(d.get("activity")), pg_timeout_s=d.get("pg_timeout_s"),
            sync_forwards=d.get("sync_forwards") or 0, syncs_skipped=d.get("syncs_skipped") or 0,
            skipped_syncs=tuple(SkippedSync.from_json(x) for x in d.get("skipped_syncs") or ()),
            where=Site.from_json(d.get("where")), in_collective=Collective.from_json(d.get("in_collective")),
            last_collective=Collective.from_json(d.get("last_collective")),
            in_data_wait=DataWait.from_json(d.get("in_data_wait")), seq=dict(d.get("seq") or {}),
            fingerprints=fingerprints if fingerprints is not None else tuple(
                Collective(g, s, op, tuple(sh), tuple(dt), at(si), None, None, ep, st, bool(j and j[0]))
                for g, s, op, sh, dt, si, ep, st, *j in d.get("fingerprints") or ()),
            site_counts=tuple(SiteCount(op, at(si), n) for op, si, n in d.get("site_counts") or ()),
            not_member=tuple(SiteCount(op, at(si), n) for op, si, n in d.get("not_member") or ()),
            mesh_dims=dict(d.get("mesh_dims") or {}),
            microbatches=tuple(Microbatches.from_json(x) for x in d.get("microbatches") or ()),
            timing=Timing.from_json(d.get("timing")), coll_count=colls.get("count") or 0,
            coll_time_s=colls.get("time_s") or 0.0,
            loaders=tuple(LoaderState.from_json(ld) for ld in d.get("loaders") or ()),
            ddp=tuple(DdpModel.from_json(x) for x in d.get("ddp") or ()), exc=RaisedError.from_json(d.get("exc")),
            done=bool(d.get("done")), teardown=bool(d.get("teardown")), exit_code=d.get("exit_code"),
            exit_site=Site.from_json(d.get("exit_site")), exit_stack=_sites(d.get("exit_stack")),
            timeline=None if tl is None else tuple(TimelineEvent.from_json(e) for e in tl),
            perf={k: d[k] for k in PERF_KEYS if k in d},
            refused=tuple(Refused.from_json(x) for x in d.get("refused") or ()),
            stack=_sites(d.get("stack")), threads=tuple(ThreadStack.from_json(t) for t in d.get("threads") or ()),
            workers=tuple(WorkerStack.from_json(w) for w in d.get("workers") or ()),
            exit=ExitStatus.from_json(d.get("exit")), busy=bool(d.get("busy")), stalled_s=d.get("stalled_s"),
            idle_s=d.get("idle_s"), outside=OutsideWait.from_json(d.get("outside")),
            sites_seen=frozenset((op, tuple(k) if k else None) for op, k in d.get("sites_seen") or ()),
            fatal_stack=bool(d.get("fatal_stack")))

    def with_(self, **kw) -> "RankState":
        return replace(self, **kw)


def missing_rank(rank: int) -> RankState:
    return RankState(rank=rank, missing=True)


# newer fields, left out when unknown (older captures and states round-trip unchanged)
_OMIT_WHEN_NONE = frozenset({"activity", "pg_timeout_s", "idle_s", "sync_forwards", "syncs_skipped", "skipped_syncs",
                             "teardown", "refused", "mesh_dims", "outside", "microbatches",
                             "exit_stack"})
# encoded field by field; the others have a compact encoding of their own in to_json
_PLAIN_FIELDS = tuple(f.name for f in fields(RankState)
                      if f.name not in ("fingerprints", "site_counts", "not_member", "perf", "sites_seen", "coll_count",
                                        "coll_time_s", "group"))
