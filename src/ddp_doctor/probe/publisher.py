"""The probe's background thread: posts the rank's state to the watcher's TCPStore and answers stack requests.

The keys are :mod:`ddp_doctor.store`'s (a side-channel store, never the user's process groups).
"""
from __future__ import annotations

import contextlib
import dataclasses
import gc
import json
import os
import threading
import time
from typing import Any, Callable

from ddp_doctor import store as side
from ddp_doctor import frames as kinds
from ddp_doctor.evidence import (Collective, DataWait, DdpModel, GroupInit, LoaderState, Microbatches, RankState, Refused,
                                 SamplerState, Site, SiteCount, SkippedSync, ThreadStack, TimelineEvent, Timing, stacks_to_json)
from ddp_doctor.evidence.compact import StateEncoder
from ddp_doctor.probe import activity, frame_values, group_calls, stackdump
from ddp_doctor.probe.groups import note_group
from ddp_doctor.probe.recorder import Recorder

INTERVAL = 0.25
FLUSH_S = 0.1      # the most a rank's thread waits for a post it asked for (flush)
DEADLINE_S = 2.0   # the most any store call may keep the rank's thread (or its exit) waiting
GIVE_UP_S = 60.0   # no connection by then: the side channel is lost, the probe records locally
# torch's elastic agent restarts the whole worker group after a failure (--max-restarts); the
# watcher tells a restarted rank's states from its predecessor's by this number
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
# the ranks' process group keys live in the agent's rendezvous store, which outlives an attempt
AGENT_STORE = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
# several nodes: the store is this node's agent's own, which reads its ranks by local rank
NODE_LOCAL_ENV = "DDP_DOCTOR_NODE_LOCAL"


def _coll(entry, sites: list[Site | None], *, pending: bool = True, blocking: bool = False) -> Collective | None:
    """A recorder entry as a record; ``waiting_s`` (since issued) only for a call not completed; ``blocking``:
    the rank's thread is inside it (``rec.cur``), not an asynchronous call issued earlier."""
    if entry is None:
        return None
    group, seq, op, shapes, dtypes, sidx, t, origin = entry
    return Collective(group, seq, op, tuple(shapes), tuple(dtypes), sites[sidx] if sidx < len(sites) else None,
                      origin, round(time.monotonic() - t, 3) if pending else None, blocking=blocking)


def _current(rec: Recorder) -> tuple[tuple | None, bool]:
    """The recorder entry of the collective the rank's thread is inside (blocking), else the oldest one it
    issued that has not completed; and whether it is inside it."""
    cur = rec.cur
    return (cur, True) if cur is not None else (rec.poll_pending(), False)


def current_collective(rec: Recorder) -> Collective | None:
    """The collective the rank is inside (or issued and not completed), or the one an exception escaped from."""
    cur = rec.cur or rec.poll_pending()
    return _coll(cur or rec.failed_in, [_site_of(t) for t in list(rec.sites)], pending=cur is not None)


def _sampler_state(rec_l) -> SamplerState | None:
    s = rec_l.sampler
    if s is None:  # the user's program dropped it (the probe holds it weakly): its last known state
        last = rec_l.sampler_last
        return None if last is None else dataclasses.replace(last, epochs_seen=tuple(rec_l.sampler_epochs)[-50:])
    rec_l.sampler_last = SamplerState(rec_l.sampler_type, getattr(s, "epoch", None), getattr(s, "shuffle", None),
                                      getattr(s, "drop_last", None), getattr(s, "num_samples", None),
                                      getattr(s, "_ddpd_set_epoch_calls", 0), tuple(rec_l.sampler_epochs)[-50:])
    return rec_l.sampler_last


def _loader(lr, sites_of) -> LoaderState:
    st = lr.settings
    steps, batches, skips, joined, skipped = lr.epoch_counts()
    return LoaderState(
        site=sites_of(lr.site), len=lr.length, num_workers=st.get("num_workers"), pin_memory=st.get("pin_memory"),
        persistent_workers=st.get("persistent_workers"), prefetch_factor=st.get("prefetch_factor"),
        batch_size=st.get("batch_size"), epochs=lr.epochs, batches=lr.batches, data_wait_s=round(lr.data_wait_s, 4),
        epoch_start_s=tuple(round(x, 4) for x in lr.epoch_start_s),
        batch_wait_s=tuple(round(x, 5) for x in lr.batch_wait), steps_by_epoch=steps,
        batches_by_epoch=batches, skips_by_epoch=skips, join_epochs=joined, skipped_batches=skipped,
        sampler=_sampler_state(lr), worker_pids=tuple(lr.worker_pids), worker_exits=lr.worker_exits)


def _site_of(t) -> Site | None:
    return None if t is None else Site(t[0], t[1], t[2], t[3] if len(t) > 3 else None)


def _sites(rec: Recorder) -> list[Site | None]:
    """The recorder's site table as records; only sites added since the last publish are built."""
    raw = list(rec.sites)
    rec.site_records.extend(_site_of(t) for t in raw[len(rec.site_records):])
    return list(rec.site_records)


def _fingerprints(rec: Recorder, ring: list[tuple], sites: list[Site | None]) -> tuple[Collective, ...]:
    """The fingerprint ring (``ring``: read before ``sites``) as records; an entry already published keeps its
    record (4 publishes a second would otherwise rebuild the same 256 records each time)."""
    n = len(sites)
    made: dict[tuple, Collective] = {}
    for t in ring:
        c = rec.fp_records.get(t)
        if c is None:
            g, s, op, sh, dt, si, ep, stp, joined = t
            c = Collective(g, s, op, tuple(sh), tuple(dt), sites[si] if si < n else None, None, None, ep, stp, joined)
        made[t] = c
    rec.fp_records = made
    return tuple(made.values())


_dumper = stackdump.StackDumper()


def _main_site(stacks: dict[int, bytes], rec: Recorder) -> Site | None:
    """The main thread's innermost user line (its innermost library line failing that)."""
    text = stacks.get(rec.main_thread_id)
    if not text:
        return None
    fs = [f for f in stackdump.frames(text) if not kinds.is_internal(f[0]) and not kinds.is_tooling(f[0])]
    user = kinds.innermost_user(fs, path=lambda f: f[0])
    got = user or (fs[-1] if fs else None)
    return _site_of(got)


def snapshot(rec: Recorder, *, with_stack: bool = False) -> RankState:
    """This rank's state as the typed record (cheap enough to build 4x a second; the hooks keep tuples).
    Never touches a frame object (``stackdump``): the user's objects must never be freed in this thread.

    The rank's thread goes on while this one reads: the fingerprint ring is read first, then the current and
    the last collective, then the site table -- so a published call is the one the rank is in or one it has
    left, and the line of each is known.  (Read the other way round, a call entered in between was published
    with no line, its record kept so, while the rank seemed in no collective: a rank gloo aborted before its
    stack was taken then stood nowhere, and the decision was lost.)"""
    ring = list(rec.ring)
    (inside, blocking), last = _current(rec), rec.last
    epoch, step_in_epoch = rec.epoch_ctx()
    tl = rec.train_loader
    steps_time = sum(rec.step_times)
    stacks = _dumper.dump()
    wait = rec.in_data_wait
    sites = _sites(rec)
    n = len(sites)
    st = RankState(
        rank=rec.rank, local_rank=rec.local_rank, host=rec.host, pid=rec.pid, attempt=ATTEMPT,
        agent_store=AGENT_STORE, world_size=rec.world_size, group=_group(rec), t=round(rec.now(), 3),
        epoch=epoch, step=rec.steps, step_in_epoch=step_in_epoch, forwards=rec.forwards, backwards=rec.backwards,
        sync_forwards=rec.sync_forwards, syncs_skipped=rec.syncs_skipped,
        skipped_syncs=tuple(SkippedSync(i, sites[si] if 0 <= si < len(sites) else None, ep)
                            for i, si, ep in list(rec.skipped_syncs)),
        progress=rec.progress, steps_by_epoch=tuple(e.steps for e in tl.trained) if tl is not None else (),
        train_loader=_position(rec.loaders, tl), step_times=tuple(round(x, 5) for x in rec.step_times),
        cpu_s=round(time.process_time(), 3), activity=activity.sample(rec, stacks), pg_timeout_s=rec.pg_timeout_s,
        where=_main_site(stacks, rec),
        in_collective=_coll(inside, sites, blocking=blocking), last_collective=_coll(last, sites, pending=False),
        in_data_wait=None if wait is None else DataWait(_position(rec.loaders, wait[0]),
                                                        round(time.monotonic() - wait[1], 3)),
        seq=dict(rec.seq),
        fingerprints=_fingerprints(rec, ring, sites),
        site_counts=tuple(SiteCount(op, sites[si] if si < n else None, c)
                          for (op, si), c in list(rec.site_counts.items())),
        not_member=tuple(SiteCount(op, sites[si] if si < n else None, c) for (op, si), c in list(rec.not_member.items())),
        mesh_dims=dict(group_calls.mesh_dims),
        microbatches=tuple(Microbatches(sites[si] if si < n else None, m) for si, m in list(rec.microbatches.items())),
        timing=Timing(rec.steps, round(rec.step_time_total, 4), round(steps_time, 4), round(rec.data_wait_s, 4),
                      round(rec.coll_time, 4), round(max(0.0, rec.step_time_total - rec.data_wait_s - rec.coll_time), 4)),
        coll_count=rec.coll_count, coll_time_s=round(rec.coll_time, 4),
        loaders=tuple(_loader(lr, _site_of) for lr in list(rec.loaders)),
        ddp=tuple(_ddp(d) for d, _ref in list(rec.ddps)),
        exc=rec.exc, done=rec.done, teardown=rec.teardown, exit_code=rec.exit_code, exit_site=rec.exit_site,
        exit_stack=rec.exit_stack,
        timeline=tuple(TimelineEvent(round(t, 4), k, round(d, 5), lab) for (t, k, d, lab) in list(rec.timeline))
        if with_stack else None,
    )
    try:
        from ddp_doctor.probe import perf as _perf

        st = st.with_(perf=_perf.state(rec))
    except Exception:
        pass
    return st


def _position(items, item) -> int | None:
    """Index of ``item`` in the bounded list as published (None once it has aged out)."""
    if item is None:
        return None
    for i, x in enumerate(list(items)):
        if x is item:
            return i
    return None


def _ddp(d: dict[str, Any]) -> DdpModel:
    """A DDP model's record; with find_unused_parameters, whether DDP ever found an unused parameter (read
    by the forward hook in the user's thread: this thread must never hold the model -- a DDP model whose
    last reference dies here tears its reducer down in the wrong thread and aborts the rank)."""
    size = d.get("unused_size")
    unused_seen = d.get("unused_seen") if size is None else size > 0
    return DdpModel(_site_of(d.get("site")), bool(d.get("find_unused_parameters")), bool(d.get("broadcast_buffers")),
                    d.get("buffers") or 0, d.get("params") or 0, unused_seen, size, tuple(d.get("named") or ()))


def _group(rec: Recorder) -> GroupInit | None:
    """The default process group the rank joined (looked for here too: an init the wrapper missed) and the
    collectives it counted."""
    note_group(rec)
    g = rec.group
    return GroupInit(0, -1) if g is None else GroupInit(g[0], g[1], _site_of(g[2]), g[3], rec.group_colls)


def thread_stacks(rec: Recorder) -> list[ThreadStack]:
    """Every thread's Python stack, main thread first (taken from this background thread: no signal needed),
    and the plain values of the main thread's user frames (only a stack request asks: ``frame_values``)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, text in _dumper.dump().items():
        if ident == me:
            continue
        main = ident == rec.main_thread_id
        out.append(ThreadStack(names.get(ident, str(ident)), main,
                               tuple(Site(*f) for f in stackdump.frames(text) if not kinds.is_tooling(f[0])),
                               frame_values.user_frame_values(ident) if main else ()))
    out.sort(key=lambda t: not t.main)
    return out


_gc_paused = False  # this thread has switched the collector off (no_gc)


def _gc_back_in_child() -> None:
    """A DataLoader worker forked while this thread had the collector off would run without it for good."""
    global _gc_paused
    if _gc_paused:
        _gc_paused = False
        gc.enable()


os.register_at_fork(after_in_child=_gc_back_in_child)


@contextlib.contextmanager
def no_gc():
    """No garbage collection while this thread builds a state: the cyclic GC runs in whichever thread
    allocates, and the user's objects (a DDP model dropped by a sweep) must be finalized in the user's
    threads, not the probe's (a DDP reducer torn down from this thread aborted the rank at exit).
    Never held across a store call, so a stuck side channel cannot leave GC off."""
    global _gc_paused
    was = gc.isenabled()
    if was:
        gc.disable()
        _gc_paused = True
    try:
        yield
    finally:
        if was:
            _gc_paused = False
            gc.enable()


STOP_GRACE_S = 5.0  # a rank that outlives the watcher's SIGTERM this long is killed (see _stop_self)


def _stop_self() -> None:
    """The watcher's stop, in this rank: SIGTERM its children (DataLoader workers, Lightning's other ranks)
    and itself; a rank whose own handler cannot run (the main thread blocked in a collective: Python handlers
    run between bytecodes, and Lightning's broadcasts the signal) is killed after ``STOP_GRACE_S``."""
    import signal

    def family(sig) -> None:
        try:
            import psutil

            for c in psutil.Process().children(recursive=True):
                c.send_signal(sig)
        except Exception:
            pass

    family(signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(STOP_GRACE_S)
    family(signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def _once(look_up: Callable[[], tuple[str, int]]) -> Callable[[], tuple[str, int]]:
    """The side channel's address looked up once (in torch's own store, whose server the user's rank 0
    owns): a reconnect must not ask it again, it may be gone by then."""
    found: list[tuple[str, int]] = []

    def where() -> tuple[str, int]:
        if not found:
            found.append(look_up())
        return found[0]

    return where


class Publisher(threading.Thread):
    """Daemon thread: connect to the watcher's store, post state, answer stack requests."""

    def __init__(self, rec: Recorder, address: "str | Callable[[], tuple[str, int]]") -> None:
        """``address``: host:port, or what looks it up (rank 0's announcement) while the channel connects."""
        super().__init__(name="ddp-doctor-probe", daemon=True)
        self.rec = rec
        self.where = (lambda: side.split_address(address)) if isinstance(address, str) else _once(address)
        self.store = self._channel()
        self.last_req = 0
        self.stopped = threading.Event()
        self.wake = threading.Event()
        self._flushes: list[threading.Event] = []
        local = os.environ.get(NODE_LOCAL_ENV) == "1"
        self.key = side.local_key(rec.local_rank) if local else side.rank_key(rec.rank)
        self.encoder = StateEncoder()

    def _channel(self):
        """Signed, never-blocking client of the watcher's store (``ddp_doctor.channel``)."""
        from ddp_doctor.channel import SideChannel, job_secret

        return SideChannel(connect=lambda: side.tcp_client(*self.where(), timeout_s=15), secret=job_secret(),
                           deadline=DEADLINE_S, give_up_s=GIVE_UP_S)

    def _state(self, *, with_stack: bool) -> tuple[RankState, dict]:
        """The rank's state, and the channel's own counts that travel beside it."""
        with no_gc():
            refused = tuple(Refused(k, why, n) for k, by in list(self.store.stats.rejected_by_key.items())
                            for why, n in list(by.items()))
            state = snapshot(self.rec, with_stack=with_stack).with_(refused=refused)
        return state, {"side_channel": {"dropped": self.store.stats.dropped, "timeouts": self.store.stats.timeouts}}

    def _state_json(self, *, with_stack: bool) -> str:
        state, extra = self._state(with_stack=with_stack)
        with no_gc():
            d = state.to_json()
            d.update(extra)
            return json.dumps(d, separators=(",", ":"), default=str)

    def _refused(self) -> int:
        return sum(n for by in list(self.store.stats.rejected_by_key.values()) for n in list(by.values()))

    def publish(self, *, final: bool = False) -> None:
        """Post the state.  Every interval: a delta against a base (``compact.StateEncoder``: the fields that
        changed and the fingerprints issued since the base; a base first now and then), not the full
        state's JSON.  The final state (with its timeline) is posted whole: the last word, read once."""
        if final:
            self.store.set(self.key, self._state_json(with_stack=True))
            return
        state, extra = self._state(with_stack=False)
        with no_gc():
            base, delta = self.encoder.encode(state, time.monotonic(), extra)
        if base is not None:
            try:
                self.store.set(side.state_base_key(self.key), base)
            except BaseException:
                self.encoder.reset()   # a delta must never name a base the store may not hold
                raise
        self.store.set(self.key, delta)

    def _counter(self, key: str, n: int, deadline: float | None = None) -> int | None:
        """The store counter ``key`` after adding ``n``; None when it holds a value someone else wrote (refused
        and counted by the channel, reported in this rank's state): the channel itself still works, so
        the posts go on -- counted as failures, a poisoned counter would end them (a rank unwatched)."""
        from ddp_doctor.channel import Rejected

        try:
            return self.store.add(key, n, deadline=deadline)
        except Rejected:
            return None

    def _answer_requests(self) -> None:
        req = self._counter(side.REQ, 0)
        if req is not None and req > self.last_req:
            self.last_req = req
            with no_gc():
                stacks = json.dumps(stacks_to_json(thread_stacks(self.rec)))
            self.store.set(self.key, self._state_json(with_stack=True))
            self.store.set(side.stack_key(self.rec.rank, req), stacks)

    def _check_stop(self) -> None:
        """Embedded mode (the watcher lives in rank 0): it decided, end this rank (and its loader workers); or
        rank 0's process is about to end, taking the store with it: let go of the store first."""
        if os.environ.get("DDP_DOCTOR_STORE_EMBEDDED") != "1":
            return
        if self.store.add(side.CLOSING, 0) > 0:
            self.store.add(side.CLOSED, 1)
            self.store.close()
            self.stopped.set()
            return
        if self.store.check([side.STOP]):
            _stop_self()

    def flush(self, timeout: float = FLUSH_S) -> None:
        """Post the state now; the calling (rank's) thread waits for it at most ``timeout`` s.

        Asked before the first call of a collective at a new line: a mismatch is usually born there and
        gloo may abort the process (SIGABRT) within a millisecond, before the next regular post, taking
        that call's shapes and dtypes with it."""
        if self.stopped.is_set() or self.store.lost or not self.is_alive():
            return
        done = threading.Event()
        self._flushes.append(done)
        self.wake.set()
        done.wait(timeout)

    def stop(self) -> None:
        self.stopped.set()
        self.wake.set()

    def run(self) -> None:
        from ddp_doctor.channel import ChannelDown

        failures = 0
        while not self.stopped.is_set():
            asked, self._flushes = self._flushes, []
            try:
                self.publish()
                for done in asked:
                    done.set()
                if asked:
                    self._counter(side.NEWS, 1)  # a first call at a line: where mismatches are born
                self._answer_requests()
                self._check_stop()
                failures = 0
            except ChannelDown:
                pass  # behind or overdue: this post is dropped (and counted); the next one may go through
            except Exception:
                failures += 1
            finally:
                for done in asked:
                    done.set()
            if self.store.lost or failures > 40:  # no watcher: record locally, training goes on
                return
            self.wake.wait(INTERVAL)
            self.wake.clear()

    def final(self, wait_ack: float = 0.0, wait_stop: float = 0.0) -> None:
        """Post the final state; optionally wait (<= wait_ack s) for the watcher to have taken the others' stacks,
        and (<= wait_stop s) for its stop: under another launcher the watcher lives in rank 0, and a launcher
        that ends the job as soon as this rank's error reaches it (Ray Train) would take the report with it.

        Never blocks on the side channel: each call has a deadline, and a channel that is behind
        (a call still stuck on an unanswering store) drops the post at once.  So the publisher's own
        post in flight is let finish first (stop() was asked; at most its deadline): a final post dropped
        for being behind it would leave the watcher the state of a step earlier, and a job that ended well
        would look like ranks that ran different numbers of steps."""
        if self.is_alive() and threading.current_thread() is not self:
            self.join(DEADLINE_S)
        try:
            self.publish(final=True)
            refused = self._refused()
            stopping = self.store.check([side.STOP])
            if self._refused() != refused:  # a forged stop refused just now: the final state must count it
                self.publish(final=True)
            if stopping:
                wait_ack = wait_stop = 0.0  # the watcher has already decided; nobody will ack
            if wait_ack > 0:
                end = time.monotonic() + wait_ack
                while time.monotonic() < end:
                    if (self._counter(side.ack_key(ATTEMPT, self.rec.rank), 0, end - time.monotonic()) or 0) > 0:
                        break
                    time.sleep(0.05)
            end = time.monotonic() + wait_stop
            while time.monotonic() < end and not self.store.check([side.STOP]):
                time.sleep(0.1)
        except Exception:
            pass
