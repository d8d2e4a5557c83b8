"""The probe's background thread: posts the rank's state to the watcher's TCPStore and answers stack requests.

The keys are :mod:`ddp_doctor.store`'s (a side-channel store, never the user's process groups).
"""
from __future__ import annotations

import json
import os
import sys
import threading
import time
from typing import Any

from ddp_doctor import store as side
from ddp_doctor.evidence import (Collective, DataWait, DdpModel, LoaderState, RankState, SamplerState, Site, SiteCount,
                                 ThreadStack, TimelineEvent, Timing, stacks_to_json)
from ddp_doctor.probe.recorder import Recorder, frames_of, user_site

INTERVAL = 0.25
# torch's elastic agent restarts the whole worker group after a failure (--max-restarts); the
# watcher tells a restarted rank's states from its predecessor's by this number
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
# the ranks' process group keys live in the agent's rendezvous store, which outlives an attempt
AGENT_STORE = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _coll(entry, sites: list[Site | None], *, pending: bool = True) -> Collective | None:
    """A recorder entry as a record; ``waiting_s`` (since issued) only for a call not completed."""
    if entry is None:
        return None
    group, seq, op, shapes, dtypes, sidx, t, origin = entry
    return Collective(group, seq, op, tuple(shapes), tuple(dtypes), sites[sidx] if sidx < len(sites) else None,
                      origin, round(time.monotonic() - t, 3) if pending else None)


def current_collective(rec: Recorder) -> Collective | None:
    """The collective the rank is inside, or the one an exception escaped from."""
    return _coll(rec.cur or rec.failed_in, [_site_of(t) for t in list(rec.sites)], pending=rec.cur is not None)


def _sampler_state(rec_l) -> SamplerState | None:
    s = rec_l.sampler
    if s is None:
        return None
    return SamplerState(type(s).__name__, getattr(s, "epoch", None), getattr(s, "shuffle", None),
                        getattr(s, "drop_last", None), getattr(s, "num_samples", None),
                        getattr(s, "_ddpd_set_epoch_calls", 0), tuple(rec_l.sampler_epochs[-50:]))


def _loader(lr, sites_of) -> LoaderState:
    st = lr.settings
    return LoaderState(
        site=sites_of(lr.site), len=lr.length, num_workers=st.get("num_workers"), pin_memory=st.get("pin_memory"),
        persistent_workers=st.get("persistent_workers"), prefetch_factor=st.get("prefetch_factor"),
        batch_size=st.get("batch_size"), epochs=lr.epochs, batches=lr.batches, data_wait_s=round(lr.data_wait_s, 4),
        epoch_start_s=tuple(round(x, 4) for x in lr.epoch_start_s),
        batch_wait_s=tuple(round(x, 5) for x in lr.batch_wait), steps_by_epoch=tuple(lr.steps_by_epoch[-100:]),
        batches_by_epoch=tuple(lr.batches_by_epoch[-100:]), skips_by_epoch=tuple(lr.skips_by_epoch[-100:]),
        sampler=_sampler_state(lr), worker_pids=tuple(lr.worker_pids))


def _site_of(t) -> Site | None:
    return None if t is None else Site(t[0], t[1], t[2])


def _sites(rec: Recorder) -> list[Site | None]:
    """The recorder's site table as records; only sites added since the last publish are built."""
    raw = list(rec.sites)
    rec.site_records.extend(_site_of(t) for t in raw[len(rec.site_records):])
    return list(rec.site_records)


def _fingerprints(rec: Recorder, sites: list[Site | None]) -> tuple[Collective, ...]:
    """The fingerprint ring as records; an entry already published keeps its record (4 publishes a
    second would otherwise rebuild the same 256 records each time)."""
    n = len(sites)
    made: dict[tuple, Collective] = {}
    for t in list(rec.ring):
        c = rec.fp_records.get(t)
        if c is None:
            g, s, op, sh, dt, si, ep, stp = t
            c = Collective(g, s, op, tuple(sh), tuple(dt), sites[si] if si < n else None, None, None, ep, stp)
        made[t] = c
    rec.fp_records = made
    return tuple(made.values())


def snapshot(rec: Recorder, *, with_stack: bool = False) -> RankState:
    """This rank's state as the typed record (cheap enough to build 4x a second; the hooks keep tuples)."""
    epoch, step_in_epoch = rec.epoch_ctx()
    tl = rec.train_loader
    steps_time = sum(rec.step_times)
    frame = sys._current_frames().get(rec.main_thread_id)
    wait = rec.in_data_wait
    sites = _sites(rec)
    n = len(sites)
    st = RankState(
        rank=rec.rank, local_rank=rec.local_rank, host=rec.host, pid=rec.pid, attempt=ATTEMPT,
        agent_store=AGENT_STORE, world_size=rec.world_size, t=round(rec.now(), 3),
        epoch=epoch, step=rec.steps, step_in_epoch=step_in_epoch, forwards=rec.forwards, backwards=rec.backwards,
        progress=rec.progress, steps_by_epoch=tuple(tl.steps_by_epoch) if tl is not None else (),
        train_loader=tl.idx if tl is not None else None, step_times=tuple(round(x, 5) for x in rec.step_times),
        cpu_s=round(time.process_time(), 3), where=_site_of(user_site(frame)) if frame is not None else None,
        in_collective=_coll(rec.cur, sites), last_collective=_coll(rec.last, sites, pending=False),
        in_data_wait=None if wait is None else DataWait(wait[0].idx, round(time.monotonic() - wait[1], 3)),
        seq=dict(rec.seq),
        fingerprints=_fingerprints(rec, sites),
        site_counts=tuple(SiteCount(op, sites[si] if si < n else None, c)
                          for (op, si), c in list(rec.site_counts.items())),
        timing=Timing(rec.steps, round(rec.step_time_total, 4), round(steps_time, 4), round(rec.data_wait_s, 4),
                      round(rec.coll_time, 4), round(max(0.0, rec.step_time_total - rec.data_wait_s - rec.coll_time), 4)),
        coll_count=rec.coll_count, coll_time_s=round(rec.coll_time, 4),
        loaders=tuple(_loader(lr, _site_of) for lr in list(rec.loaders)),
        ddp=tuple(_ddp(d, obj) for d, obj in zip(list(rec.ddps), list(rec.ddp_objs))),
        exc=rec.exc, done=rec.done, exit_code=rec.exit_code, exit_site=rec.exit_site,
        timeline=tuple(TimelineEvent(round(t, 4), k, round(d, 5), lab) for (t, k, d, lab) in list(rec.timeline))
        if with_stack else None,
    )
    try:
        from ddp_doctor.probe import perf as _perf

        st = st.with_(perf=_perf.state(rec))
    except Exception:
        pass
    return st


def _ddp(d: dict[str, Any], obj) -> DdpModel:
    """A DDP model's record; with find_unused_parameters, whether DDP ever found an unused parameter."""
    unused_seen, size = d.get("unused_seen"), None
    if d.get("find_unused_parameters"):
        try:
            size = int(obj._get_ddp_logging_data().get("unused_parameter_size", 0))
            unused_seen = size > 0
        except Exception:
            pass
    return DdpModel(_site_of(d.get("site")), bool(d.get("find_unused_parameters")), bool(d.get("broadcast_buffers")),
                    d.get("buffers") or 0, d.get("params") or 0, unused_seen, size)


def thread_stacks(rec: Recorder) -> list[ThreadStack]:
    """Every thread's Python stack, main thread first (taken from this background thread: no signal needed)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        out.append(ThreadStack(names.get(ident, str(ident)), ident == rec.main_thread_id,
                               tuple(Site(*f) for f in frames_of(frame))))
    out.sort(key=lambda t: not t.main)
    return out


class Publisher(threading.Thread):
    """Daemon thread: connect to the watcher's store, post state, answer stack requests."""

    def __init__(self, rec: Recorder, address: str) -> None:
        super().__init__(name="ddp-doctor-probe", daemon=True)
        self.rec = rec
        self.host, self.port = side.split_address(address)
        self.store = None
        self.lock = threading.Lock()
        self.last_req = 0
        self.stopped = threading.Event()

    def _connect(self):
        return side.join_store(self.host, self.port, timeout_s=15)

    def publish(self, *, final: bool = False) -> None:
        data = json.dumps(snapshot(self.rec, with_stack=final).to_json(), separators=(",", ":"), default=str)
        with self.lock:
            if self.store is None:
                self.store = self._connect()
            self.store.set(side.rank_key(self.rec.rank), data)

    def _answer_requests(self) -> None:
        with self.lock:
            req = self.store.add(side.REQ, 0)
        if req > self.last_req:
            self.last_req = req
            stacks = stacks_to_json(thread_stacks(self.rec))
            data = json.dumps(snapshot(self.rec, with_stack=True).to_json(), separators=(",", ":"), default=str)
            with self.lock:
                self.store.set(side.rank_key(self.rec.rank), data)
                self.store.set(side.stack_key(self.rec.rank, req), json.dumps(stacks))

    def _check_stop(self) -> None:
        """Embedded mode: the watcher in rank 0 decided; end this rank (and its loader workers)."""
        if os.environ.get("DDP_DOCTOR_STORE_EMBEDDED") != "1":
            return
        with self.lock:
            stop = self.store.check([side.STOP])
        if stop:
            import signal

            try:
                import psutil

                for c in psutil.Process().children(recursive=True):
                    c.terminate()
            except Exception:
                pass
            os.kill(os.getpid(), signal.SIGTERM)

    def run(self) -> None:
        failures = 0
        while not self.stopped.is_set():
            try:
                self.publish()
                self._answer_requests()
                self._check_stop()
                failures = 0
            except Exception:
                failures += 1
                with self.lock:
                    self.store = None
                if failures > 40:  # watcher gone for ~10 s: stay silent, training goes on
                    return
            self.stopped.wait(INTERVAL)

    def final(self, wait_ack: float = 0.0) -> None:
        """Post the final state synchronously; optionally wait for the watcher to have taken the others' stacks."""
        try:
            self.publish(final=True)
            with self.lock:
                if self.store.check([side.STOP]):
                    wait_ack = 0.0  # the watcher has already decided; nobody will ack
            if wait_ack > 0:
                end = time.monotonic() + wait_ack
                while time.monotonic() < end:
                    with self.lock:
                        if self.store.add(side.ack_key(ATTEMPT, self.rec.rank), 0) > 0:
                            break
                    time.sleep(0.05)
        except Exception:
            pass
