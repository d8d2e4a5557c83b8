"""Small records of the evidence wire format: a source line, a collective call, an exit, an exception,
a DataLoader and its sampler, a DDP model, timings, timeline spans, stacks."""
from __future__ import annotations

import os
from dataclasses import dataclass, fields
from typing import Any

from ddp_doctor.evidence.agreement import must_agree

SCHEMA = "ddp-doctor/evidence/v1"


def _tuple(xs) -> tuple:
    return tuple(xs) if xs else ()



# -- small records -------------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Site:
    """A source line: a call site, a stack frame, where a rank is.  ``api``: the torch API the user called
    there that issued the collective (``ddp_doctor.apis``: "dcp.save"), when not a collective itself."""
    path: str
    line: int
    function: str | None = None
    api: str | None = None

    def key(self) -> tuple:
        """Sites compare by file name, line and function (paths differ between nodes)."""
        return (os.path.basename(self.path), self.line, self.function)

    def to_json(self) -> dict[str, Any]:
        d = {"path": self.path, "line": self.line, "function": self.function}
        if self.api:
            d["api"] = self.api
        return d

    def to_list(self) -> list:
        """The compact form of the sites tables: [path, line, function(, api)]."""
        return [self.path, self.line, self.function] + ([self.api] if self.api else [])

    @classmethod
    def from_json(cls, d) -> "Site | None":
        if not d:
            return None
        if isinstance(d, Site):
            return d
        if isinstance(d, (list, tuple)):
            return cls(d[0], int(d[1] or 0), d[2] if len(d) > 2 else None, d[3] if len(d) > 3 else None)
        return cls(d["path"], int(d.get("line") or 0), d.get("function"), d.get("api"))


def _site_json(s: Site | None):
    return None if s is None else s.to_json()


def _sites(xs) -> tuple[Site, ...]:
    return tuple(s for s in (Site.from_json(x) for x in xs or ()) if s is not None)



@dataclass(frozen=True, slots=True)
class Collective:
    """One collective call of a rank: its position (group, seq), what it is, where it was issued.

    ``shapes``: its tensors' shapes, or for a group creation its arguments (``ranks=[0, 1]``);
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
    join: bool = False   # issued inside DDP's Join: ranks' calls legitimately differ there
    blocking: bool = False  # the rank's thread is inside this synchronous call (not an issued async one)

    def must_agree(self) -> tuple:
        """What torch requires every rank's call at this position to agree on (``evidence.agreement``)."""
        return must_agree(self.op, self.group, self.shapes, self.dtypes)

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"group": self.group, "seq": self.seq, "op": self.op, "shapes": list(self.shapes),
                             "dtypes": list(self.dtypes), "site": _site_json(self.site)}
        for k in ("origin", "waiting_s", "epoch", "step_in_epoch"):
            v = getattr(self, k)
            if v is not None:
                d[k] = v
        if self.join:
            d["join"] = True
        if self.blocking:
            d["blocking"] = True
        return d

    @classmethod
    def from_json(cls, d) -> "Collective | None":
        if not d:
            return None
        if isinstance(d, Collective):
            return d
        return cls(d.get("group"), d.get("seq"), d["op"], tuple(d.get("shapes") or ()), tuple(d.get("dtypes") or ()),
                   Site.from_json(d.get("site")), d.get("origin"), d.get("waiting_s"), d.get("epoch"),
                   d.get("step_in_epoch"), bool(d.get("join")), bool(d.get("blocking")))


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
class Activity:
    """Signs of life of a rank, sampled at each publish: CPU seconds and bytes read + written
    (``/proc``'s rchar + wchar) of its training thread (the one that runs the model, the loader and the
    collectives; the probe's own threads never count), its DataLoader workers' CPU seconds, and a
    signature of the training thread's Python stack.  A rank none of these moved for is stuck, not slow."""
    cpu_s: float = 0.0
    io_bytes: int = 0
    workers_cpu_s: float = 0.0
    stack_sig: int = 0
    tid: int | None = None   # the training thread's native id (the watcher reads what it is blocked in)

    def to_json(self) -> list:
        return [self.cpu_s, self.io_bytes, self.workers_cpu_s, self.stack_sig, *(() if self.tid is None else (self.tid,))]

    @classmethod
    def from_json(cls, d) -> "Activity | None":
        if not d:
            return None
        if isinstance(d, Activity):
            return d
        return cls(float(d[0]), int(d[1]), float(d[2]), int(d[3]), int(d[4]) if len(d) > 4 and d[4] else None)


@dataclass(frozen=True, slots=True)
class SkippedSync:
    """A DDP forward that prepared a gradient sync followed by no backward before the next forward: DDP runs
    that sync's all-reduce at the rank's next backward, a step late, or never (``iteration``: the forward's
    number among those that prepared a sync, 1-based)."""
    iteration: int
    site: Site | None = None
    epoch: int | None = None

    def to_json(self) -> list:
        return [self.iteration, _site_json(self.site), self.epoch]

    @classmethod
    def from_json(cls, d) -> "SkippedSync":
        return d if isinstance(d, SkippedSync) else cls(int(d[0]), Site.from_json(d[1]), d[2])


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
class WorkerExit:
    """A DataLoader worker process found dead when its rank failed: killed by ``signal``, or ``exit_code``."""
    pid: int
    exit_code: int | None = None
    signal: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"pid": self.pid, "exit_code": self.exit_code, "signal": self.signal}

    @classmethod
    def from_json(cls, d) -> "WorkerExit":
        return d if isinstance(d, WorkerExit) else cls(int(d["pid"]), d.get("exit_code"), d.get("signal"))


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
    join_epochs: tuple[int, ...] = ()   # training epochs run under DDP's Join
    skipped_batches: tuple[tuple[int, int], ...] = ()  # (epoch, batch number) led to no step, the first few
    worker_exits: tuple[WorkerExit, ...] = ()  # workers found dead when the rank failed

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            d[f.name] = _site_json(v) if f.name == "site" else v.to_json() if f.name == "sampler" and v else \
                list(v) if isinstance(v, tuple) else v
        for k in ("join_epochs", "skipped_batches"):  # absent when empty: older captures stay exact
            if not d[k]:
                del d[k]
        if self.skipped_batches:
            d["skipped_batches"] = [list(x) for x in self.skipped_batches]
        if self.worker_exits:
            d["worker_exits"] = [w.to_json() for w in self.worker_exits]
        else:  # absent when none (captures of older runs stay exact)
            del d["worker_exits"]
        return d

    @classmethod
    def from_json(cls, d) -> "LoaderState":
        kw = {f.name: d.get(f.name) for f in fields(cls) if f.name in d}
        kw["site"] = Site.from_json(d.get("site"))
        kw["sampler"] = SamplerState.from_json(d.get("sampler"))
        for k in ("epoch_start_s", "batch_wait_s", "steps_by_epoch", "batches_by_epoch", "skips_by_epoch", "worker_pids",
                  "join_epochs"):
            kw[k] = _tuple(d.get(k))
        kw["skipped_batches"] = tuple((int(e), int(b)) for e, b in d.get("skipped_batches") or ())
        kw["worker_exits"] = tuple(WorkerExit.from_json(w) for w in d.get("worker_exits") or ())
        for k in ("epochs", "batches"):
            kw[k] = kw.get(k) or 0
        kw["data_wait_s"] = kw.get("data_wait_s") or 0.0
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class DdpParam:
    """A parameter of a DDP model by its index in DDP's list of parameters that get gradients (the index
    torch's errors print): its name in ``module.named_parameters()`` and the type of the module holding it."""
    index: int
    name: str
    module_type: str | None = None

    @property
    def module(self) -> str:
        """The path of the module holding it ("" for the root module)."""
        return self.name.rpartition(".")[0]

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "name": self.name, "module_type": self.module_type}

    @classmethod
    def from_json(cls, d) -> "DdpParam":
        return d if isinstance(d, DdpParam) else cls(int(d["index"]), str(d["name"]), d.get("module_type"))


@dataclass(frozen=True, slots=True)
class DdpModel:
    """One DistributedDataParallel construction of a rank.

    ``named_params``: only the parameters an error of this rank referred to by index (a model's whole list
    is kept inside the rank, never published)."""
    site: Site | None = None
    find_unused_parameters: bool = False
    broadcast_buffers: bool = False
    buffers: int = 0
    params: int = 0
    unused_seen: bool | None = None
    unused_parameter_size: int | None = None
    named_params: tuple[DdpParam, ...] = ()

    def to_json(self) -> dict[str, Any]:
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["site"] = _site_json(self.site)
        if self.unused_parameter_size is None:
            del d["unused_parameter_size"]
        if self.named_params:  # absent when empty (captures of older runs stay exact)
            d["named_params"] = [p.to_json() for p in self.named_params]
        else:
            del d["named_params"]
        return d

    @classmethod
    def from_json(cls, d) -> "DdpModel":
        kw = {f.name: d[f.name] for f in fields(cls) if d.get(f.name) is not None}
        kw["site"] = Site.from_json(d.get("site"))
        kw["named_params"] = tuple(DdpParam.from_json(p) for p in d.get("named_params") or ())
        return cls(**kw)


@dataclass(frozen=True, slots=True)
class GroupInit:
    """The default process group a rank joined: the size and rank it saw (``init_process_group`` or
    whatever called it), where it was initialised when the probe saw the call, the backend, and how many
    collectives the group itself had counted when last looked at (all of them: DDP's, functional ones).
    ``size`` 0: the rank has initialised no process group (so far); a state without a GroupInit comes
    from a probe that did not look."""
    size: int
    rank: int
    site: Site | None = None
    backend: str | None = None
    collectives: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"size": self.size, "rank": self.rank, "site": _site_json(self.site), "backend": self.backend,
                "collectives": self.collectives}

    @classmethod
    def from_json(cls, d) -> "GroupInit | None":
        if not d:
            return None
        if isinstance(d, GroupInit):
            return d
        return cls(int(d["size"]), int(d["rank"]), Site.from_json(d.get("site")), d.get("backend"),
                   d.get("collectives"))


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
    """One span of a rank's timeline: kind step | collective | data_wait | h2d | epoch (and in the report, stall:
    ``session.assemble.stall_bands``)."""
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
class SiteCount:
    """How many times a rank issued ``op`` at ``site``."""
    op: str
    site: Site | None
    calls: int


@dataclass(frozen=True, slots=True)
class Microbatches:
    """How many micro-batches a pipeline schedule split each batch into, as this rank ran its ``step`` at
    ``site``: every stage must split alike (their sends and receives pair micro-batch by micro-batch)."""
    site: Site | None
    n: int

    def to_json(self) -> list[Any]:
        return [self.site.to_json() if self.site else None, self.n]

    @classmethod
    def from_json(cls, d) -> "Microbatches":
        return cls(Site.from_json(d[0]), int(d[1]))


@dataclass(frozen=True, slots=True)
class Refused:
    """Side-channel values a reader dropped under ``key`` for ``reason`` (unsigned, bad signature,
    replayed, malformed): a rank reports those it refused (a forged ``ddpd/stop``), so the report counts them."""
    key: str
    reason: str
    count: int

    def to_json(self) -> list[Any]:
        return [self.key, self.reason, self.count]

    @classmethod
    def from_json(cls, d) -> "Refused":
        return cls(str(d[0]), str(d[1]), int(d[2]))
