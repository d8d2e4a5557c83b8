"""The probe's in-memory record of one rank: counters, collective fingerprints, loaders, timeline.

Everything here is written by the rank's own threads through cheap attribute
updates (no locks on the hot path: the GIL makes single attribute/deque updates
atomic enough for a monitor) and read by the publisher thread, which turns it
into the typed state (:class:`ddp_doctor.evidence.RankState`) posted on the side-channel store.
"""
from __future__ import annotations

import os
import socket
import threading
import time
import weakref
from collections import deque
from typing import Any

from ddp_doctor.frames import live_frames as frames_of  # noqa: F401 - the probe's names for them
from ddp_doctor.frames import user_site_of as user_site  # noqa: F401

_RING = 256
_PENDING = 512  # asynchronous collectives in flight at once (FSDP issues hundreds per step)
_TIMELINE = 2000
_OBJECTS = 32   # the last DataLoaders / DDP models kept on record (a job may build thousands)


class EpochRec:
    """One pass over a DataLoader (one ``iter(loader)``).  It becomes a *training epoch* -- numbered,
    counted in ``steps_by_epoch`` -- only when an optimizer step follows one of its batches: rank 0
    drawing a batch to log its shape, or a few for sample predictions, is not an epoch."""

    __slots__ = ("index", "steps", "batches", "skips", "skipped", "steps_at_batch", "joined")

    def __init__(self) -> None:
        self.index: int | None = None  # position among the loader's training epochs, once one
        self.steps = 0
        self.batches = 0
        self.skips = 0          # batches followed by no optimizer step before the next batch
        self.skipped: list[int] = []  # which ones (1-based batch numbers, the first few)
        self.steps_at_batch = -1
        self.joined = False     # ran (partly) inside DDP's Join: ranks may differ in steps


class LoaderRec:
    """What the probe knows about one DataLoader (keyed by the object)."""

    __slots__ = ("site", "settings", "length", "epochs", "batches", "data_wait_s", "epoch_start_s",
                 "batch_wait", "trained", "cur", "_sampler", "sampler_type", "sampler_last", "sampler_epochs",
                 "worker_pids", "workers", "worker_exits", "iter_t", "first_batch_pending", "idx")

    def __init__(self, idx: int, site, settings: dict[str, Any], sampler) -> None:
        self.idx = idx
        self.site = site
        self.settings = settings
        self.length: int | None = None
        self.epochs = 0          # passes (iter() calls); training epochs are ``trained``
        self.batches = 0
        self.data_wait_s = 0.0
        self.epoch_start_s: deque[float] = deque(maxlen=100)
        self.batch_wait: deque[float] = deque(maxlen=200)
        self.trained: list[EpochRec] = []  # the passes that became training epochs, in order
        self.cur: EpochRec | None = None    # the pass that yielded the latest batch
        self._sampler = _weak(sampler)  # never keep the user's sampler (and its dataset) alive
        self.sampler_type = type(sampler).__name__ if sampler is not None else None
        self.sampler_last: Any = None  # its last published state, kept once the user drops it
        self.sampler_epochs: deque[int | None] = deque(maxlen=100)
        self.worker_pids: list[int] = []
        self.workers: list[Any] = []  # weak references to the worker processes (probe/workers.py)
        self.worker_exits: tuple = ()  # (pid, exit code) of workers found dead when the rank failed
        self.iter_t = 0.0
        self.first_batch_pending = False

    def epoch_counts(self, limit: int = 100) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                                                      tuple[int, ...], tuple[tuple[int, int], ...]]:
        """(steps, batches, skipped batches) per training epoch, the last ``limit``, the indices of the
        training epochs run under DDP's Join, and (epoch, batch) of the first skipped batches."""
        eps = self.trained[-limit:]
        return (tuple(e.steps for e in eps), tuple(e.batches for e in eps), tuple(e.skips for e in eps),
                tuple(e.index for e in eps if e.joined),
                tuple((e.index, b) for e in eps for b in e.skipped)[:16])

    @property
    def sampler(self):
        """The loader's sampler while the user's program still holds it, else None."""
        return self._sampler() if self._sampler is not None else None


def _weak(obj):
    """A weak reference to ``obj`` (None for None or an object that cannot be weakly referenced)."""
    if obj is None:
        return None
    try:
        return weakref.ref(obj)
    except TypeError:
        return None


class Recorder:
    """All counters of one rank.  Only the hooks write; the publisher reads."""

    def __init__(self) -> None:
        env = os.environ
        self.rank = int(env.get("RANK", "0"))
        self.local_rank = int(env.get("LOCAL_RANK", "0"))
        self.world_size = int(env.get("WORLD_SIZE", "1"))
        self.group: tuple | None = None  # the default process group: (size, rank, site, backend), probe/groups.py
        self.group_colls: int | None = None  # collectives that group counted, as last seen
        self.host = socket.gethostname()
        self.pid = os.getpid()
        try:
            self.t0 = float(env.get("DDP_DOCTOR_T0", "")) or time.time()
        except ValueError:
            self.t0 = time.time()
        self.main_thread_id = threading.main_thread().ident
        self.train_thread: int | None = None  # the thread that last ran the model, a batch or a step
        self.pg_timeout_s: float | None = None  # the default process group's timeout
        self.seq: dict[str, int] = {}
        # current collective: (group, seq, op, shapes, dtypes, site_idx, t_enter_monotonic, origin)
        self.cur: tuple | None = None
        self.last: tuple | None = None
        self.failed_in: tuple | None = None  # the collective an exception escaped from
        # issued collectives whose call returned before the work completed (async_op=True; NCCL, whose
        # calls return once queued on the stream): [entry, work] oldest first, until work.is_completed()
        self.pending: deque[tuple] = deque(maxlen=_PENDING)
        # fingerprints: (group, seq, op, shapes, dtypes, site_idx, epoch, step_in_epoch, inside a Join)
        self.ring: deque[tuple] = deque(maxlen=_RING)
        self.sites: list[tuple[str, int, str] | None] = []
        self._site_idx: dict[Any, int] = {}
        self.site_counts: dict[tuple[str, int], int] = {}  # (op, site_idx) -> calls
        self.not_member: dict[tuple[str, int], int] = {}  # the same, of calls on a group this rank is not in
        self.microbatches: dict[int, int] = {}  # site_idx of a pipeline schedule's step -> its micro-batch count
        self.coll_count = 0
        self.coll_time = 0.0
        self.progress = 0
        self.forwards = 0
        self.backwards = 0
        self.steps = 0
        self.step_times: deque[float] = deque(maxlen=200)
        self.step_time_total = 0.0
        self.last_step_t: float | None = None
        self.first_step_t: float | None = None
        self.loaders: deque[LoaderRec] = deque(maxlen=_OBJECTS)
        self.loaders_made = 0
        self.train_loader: LoaderRec | None = None
        self.last_loader: LoaderRec | None = None
        self.data_wait_s = 0.0
        self.in_data_wait: tuple[LoaderRec, float] | None = None
        # (record, weak reference to the DDP module): the model is the user's to free
        self.ddps: deque[tuple[dict[str, Any], Any]] = deque(maxlen=_OBJECTS)
        self.ddp_optimizers: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()  # trains_ddp
        self.pending_grad_sync: Any = None  # the group of the gradient sync the last DDP forward prepared
        self.pending_sync_site = -1
        self.sync_forwards = 0    # DDP forwards that prepared a gradient sync (grad mode, sync not disabled)
        self.syncs_skipped = 0    # ... followed by no backward before the next one
        self.pending_skipped = False  # the pending sync is already counted as skipped (``sync_overtaken``)
        self.skipped_syncs: list[tuple[int, int, int | None]] = []  # (iteration, site index, epoch), the first few
        self.join_depth = 0   # inside DDP's Join context manager (probe/groups.py)
        self.teardown = False  # destroy_process_group() of the default group was called
        self.join_exits = 0
        self.timeline: deque[tuple] = deque(maxlen=_TIMELINE)
        self.exc: Any = None  # evidence.RaisedError, set once by the probe when the program raises
        self.exit_site: Any = None  # evidence.Site where sys.exit() was called
        self.exit_stack: tuple = ()  # the user frames it was called through (evidence.Site), outermost first
        self.done = False
        self.exit_code: int | None = None
        self.version = 0  # bumped on notable changes (the publisher posts early)
        self.flush: Any = None  # the publisher's flush(): post now (before a collective's first call at a line)
        # the publisher's records of sites and fingerprints already built (its thread only)
        self.site_records: list[Any] = []
        self.fp_records: dict[tuple, Any] = {}

    # -- helpers -----------------------------------------------------------------
    def site_index(self, site) -> int:
        idx = self._site_idx.get(site)
        if idx is None:
            idx = len(self.sites)
            self.sites.append(site)
            self._site_idx[site] = idx
        return idx

    def now(self) -> float:
        return time.time() - self.t0

    def epoch_ctx(self) -> tuple[int | None, int | None]:
        """(training epoch, optimizer steps in it) of the training loader's current pass; a pass not yet
        followed by a step counts as the epoch it would become."""
        tl = self.train_loader
        e = tl.cur if tl is not None else None
        if e is None:
            return None, None
        return (e.index if e.index is not None else len(tl.trained)), e.steps

    # -- events -----------------------------------------------------------------
    def coll_enter(self, group: str, op: str, shapes, dtypes, site, origin: str = "user") -> tuple:
        seq = self.seq.get(group, 0)
        self.seq[group] = seq + 1
        sidx = self.site_index(site)
        entry = (group, seq, op, shapes, dtypes, sidx, time.monotonic(), origin)
        self.cur = entry
        ep, st = self.epoch_ctx()
        self.ring.append((group, seq, op, shapes, dtypes, sidx, ep, st, self.join_depth > 0))
        key = (op, sidx)
        self.site_counts[key] = self.site_counts.get(key, 0) + 1
        return entry

    def not_member_call(self, op: str, site) -> None:
        """A collective on a group this rank is not a member of: torch skips it with a warning."""
        key = (op, self.site_index(site))
        self.not_member[key] = self.not_member.get(key, 0) + 1

    def coll_leave(self, entry: tuple) -> None:
        dur = time.monotonic() - entry[6]
        self.coll_count += 1
        if self.first_step_t is not None:  # step-phase time only (not init/rendezvous waits)
            self.coll_time += dur
        self.progress += 1
        self.last = entry
        if self.cur is entry:
            self.cur = None
        if dur > 0.001 or self.coll_count % 16 == 0:
            self.timeline.append((self.now() - dur, "collective", dur, entry[2]))

    def coll_pending(self, entry: tuple, work) -> None:
        """``entry``'s call returned with its ``work`` still running: the rank stays issued in it."""
        if self.cur is entry:
            self.cur = None
        if len(self.pending) >= 32:
            self.poll_pending()
        self.pending.append((entry, work))

    def poll_pending(self) -> tuple | None:
        """Leave every pending collective whose work completed; the oldest still running, or None.

        A completed asynchronous collective counts as progress; its time overlapped the rank's other
        work, so it is not added to collective time."""
        oldest = None
        for item in list(self.pending):
            entry, work = item
            try:
                done = bool(work.is_completed())
            except Exception:  # a work torch no longer knows (aborted group): not ours to hold on to
                done = True
            if not done:
                if oldest is None:
                    oldest = entry
                continue
            try:
                self.pending.remove(item)
            except ValueError:  # the other thread polled it first
                continue
            self.coll_count += 1
            self.progress += 1
            if self.last is None or self.last[6] <= entry[6]:
                self.last = entry
        return oldest

    def batch_drawn(self, lr: LoaderRec, e: EpochRec) -> None:
        """Pass ``e`` of loader ``lr`` yielded a batch; the previous batch of this pass led to no optimizer
        step if the step count did not move since (a skipped batch)."""
        lr.cur = e
        e.batches += 1
        e.joined = e.joined or self.join_depth > 0
        if lr is self.train_loader and e.steps_at_batch == self.steps:
            e.skips += 1
            if len(e.skipped) < 8:
                e.skipped.append(e.batches - 1)
        e.steps_at_batch = self.steps

    def sync_forward(self, group: str, site_idx: int) -> None:
        """A DDP forward prepared a gradient sync; if the previous one's backward never ran, that
        iteration's sync was skipped on this rank (an early ``return``/``continue`` before backward)."""
        self.sync_overtaken()
        self.sync_forwards += 1
        self.pending_grad_sync = group
        self.pending_sync_site = site_idx
        self.pending_skipped = False

    def sync_overtaken(self) -> None:
        """Another DDP forward ran while the previous one's gradient sync is still pending: that forward's
        backward never ran.  Also when the new forward prepares no sync of its own (the first micro-step of
        the next gradient accumulation, under ``no_sync()``): DDP then runs the pending sync at that forward's
        backward, a step late on this rank."""
        if self.pending_grad_sync is None or self.pending_skipped:
            return
        self.syncs_skipped += 1
        if len(self.skipped_syncs) < 8:
            self.skipped_syncs.append((self.sync_forwards, self.pending_sync_site, self.epoch_ctx()[0]))
        self.pending_skipped = True
        self.version += 1

    def trains_ddp(self, opt) -> bool:
        """Does this optimizer step a DDP model's parameters (a training step)?  A rank-local optimizer (a
        linear probe, an EMA, a discriminator trained on one rank) is not; without a DDP model (FSDP, plain
        collectives) every optimizer step counts.  Decided at its first step with a DDP model on record."""
        models = [m for _rd, ref in self.ddps if (m := ref()) is not None]
        if not models:
            return True
        known = self.ddp_optimizers.get(opt)
        if known is None:
            ours = {id(p) for m in models for p in m.parameters()}
            known = any(id(p) in ours for g in opt.param_groups for p in g["params"])
            self.ddp_optimizers[opt] = known
        return known

    def step(self) -> None:
        t = time.monotonic()
        self.steps += 1
        self.progress += 1
        if self.last_step_t is not None:
            dt = t - self.last_step_t
            self.step_times.append(dt)
            self.step_time_total += dt
            self.timeline.append((self.now() - dt, "step", dt, f"step {self.steps}"))
        else:
            self.first_step_t = t
        self.last_step_t = t
        lr = self.last_loader
        if lr is not None:
            e = lr.cur
            if e is not None:
                if e.index is None:  # this pass's first step: it is a training epoch
                    e.index = len(lr.trained)
                    lr.trained.append(e)
                e.steps += 1
            if self.train_loader is not lr:
                self.train_loader = lr
                self.version += 1
