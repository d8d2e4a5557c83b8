"""The probe's background thread: posts the rank's state to the watcher's TCPStore and answers stack requests.

Keys (all under the ``ddpd/`` prefix of the side-channel store, never the user's):
- ``ddpd/rank/<rank>``   JSON state (BOARD.md "PER-RANK EVIDENCE FORMAT"), every ~0.25 s
- ``ddpd/req``           counter the watcher bumps to ask for stacks
- ``ddpd/stack/<rank>/<req>``  JSON ``{"threads": [{"name", "main", "frames"}]}``
- ``ddpd/ack/<attempt>/<rank>``  the watcher's go-ahead for a failing rank to exit
- ``ddpd/stop``          the watcher is stopping the job
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

from ddp_doctor.probe.recorder import Recorder, frames_of, user_site

INTERVAL = 0.25
DEADLINE_S = 2.0   # the most any store call may keep the rank's thread (or its exit) waiting
GIVE_UP_S = 60.0   # no connection by then: the side channel is lost, the probe records locally
# torch's elastic agent restarts the whole worker group after a failure (--max-restarts); the
# watcher tells a restarted rank's states from its predecessor's by this number
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0)
# the ranks' process group keys live in the agent's rendezvous store, which outlives an attempt
AGENT_STORE = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"


def _site(rec: Recorder, idx):
    s = rec.sites[idx] if idx is not None and idx < len(rec.sites) else None
    return None if s is None else {"path": s[0], "line": s[1], "function": s[2]}


def _coll(rec: Recorder, entry) -> dict[str, Any] | None:
    if entry is None:
        return None
    group, seq, op, shapes, dtypes, sidx, t, origin = entry
    return {"group": group, "seq": seq, "op": op, "shapes": list(shapes), "dtypes": list(dtypes),
            "site": _site(rec, sidx), "origin": origin,
            "waiting_s": round(time.monotonic() - t, 3)}


def _sampler_state(rec_l) -> dict[str, Any] | None:
    s = rec_l.sampler
    if s is None:
        return None
    return {
        "type": rec_l.sampler_type,
        "epoch": getattr(s, "epoch", None),
        "shuffle": getattr(s, "shuffle", None),
        "drop_last": getattr(s, "drop_last", None),
        "num_samples": getattr(s, "num_samples", None),
        "set_epoch_calls": getattr(s, "_ddpd_set_epoch_calls", 0),
        "epochs_seen": list(rec_l.sampler_epochs)[-50:],
    }


def snapshot(rec: Recorder, *, with_stack: bool = False) -> dict[str, Any]:
    """The JSON-able state of this rank (cheap enough to build 4x a second)."""
    epoch, step_in_epoch = rec.epoch_ctx()
    tl = rec.train_loader
    steps_time = sum(rec.step_times)
    frame = sys._current_frames().get(rec.main_thread_id)
    where = user_site(frame) if frame is not None else None
    wait = rec.in_data_wait
    state: dict[str, Any] = {
        "rank": rec.rank, "local_rank": rec.local_rank, "host": rec.host, "pid": rec.pid,
        "attempt": ATTEMPT, "agent_store": AGENT_STORE,
        "world_size": rec.world_size, "t": round(rec.now(), 3),
        "epoch": epoch, "step": rec.steps, "step_in_epoch": step_in_epoch,
        "forwards": rec.forwards, "backwards": rec.backwards, "progress": rec.progress,
        "steps_by_epoch": list(tl.steps_by_epoch) if tl is not None else [],
        "train_loader": _position(rec.loaders, tl),
        "step_times": [round(x, 5) for x in rec.step_times],
        "cpu_s": round(time.process_time(), 3),
        "where": None if where is None else {"path": where[0], "line": where[1], "function": where[2]},
        "in_collective": _coll(rec, rec.cur),
        "last_collective": _coll(rec, rec.last),
        "in_data_wait": None if wait is None else {"loader": _position(rec.loaders, wait[0]),
                                                   "waiting_s": round(time.monotonic() - wait[1], 3)},
        "seq": dict(rec.seq),
        "fingerprints": [[g, s, op, list(sh), list(dt), si, ep, st] for (g, s, op, sh, dt, si, ep, st) in list(rec.ring)],
        "sites": [None if s is None else [s[0], s[1], s[2]] for s in rec.sites],
        "site_counts": [[op, si, n] for (op, si), n in list(rec.site_counts.items())],
        "timing": {
            "steps": rec.steps, "step_time_s": round(rec.step_time_total, 4),
            "step_time_last200_s": round(steps_time, 4), "data_wait_s": round(rec.data_wait_s, 4),
            "collective_s": round(rec.coll_time, 4),
            "compute_s": round(max(0.0, rec.step_time_total - rec.data_wait_s - rec.coll_time), 4),
        },
        "collectives": {"count": rec.coll_count, "time_s": round(rec.coll_time, 4)},
        "loaders": [{
            "site": _site_dict(lr.site), "len": lr.length, **lr.settings,
            "epochs": lr.epochs, "batches": lr.batches, "data_wait_s": round(lr.data_wait_s, 4),
            "epoch_start_s": [round(x, 4) for x in lr.epoch_start_s],
            "batch_wait_s": [round(x, 5) for x in lr.batch_wait],
            "steps_by_epoch": list(lr.steps_by_epoch[-100:]),
            "batches_by_epoch": list(lr.batches_by_epoch[-100:]),
            "skips_by_epoch": list(lr.skips_by_epoch[-100:]),
            "sampler": _sampler_state(lr), "worker_pids": list(lr.worker_pids),
        } for lr in list(rec.loaders)],
        "ddp": [dict(d) for d, _ref in list(rec.ddps)],
        "exc": rec.exc, "done": rec.done, "exit_code": rec.exit_code, "exit_site": rec.exit_site,
    }
    _ddp_unused(rec, state)
    try:
        from ddp_doctor.probe import perf as _perf

        state.update(_perf.state(rec))
    except Exception:
        pass
    if with_stack:
        state["timeline"] = [{"t": round(t, 4), "kind": k, "dur": round(d, 5), "label": lab} for (t, k, d, lab) in list(rec.timeline)]
    return state


def _position(items, item) -> int | None:
    """Index of ``item`` in the bounded list as published (None once it has aged out)."""
    if item is None:
        return None
    for i, x in enumerate(list(items)):
        if x is item:
            return i
    return None


def _ddp_unused(rec: Recorder, state: dict[str, Any]) -> None:
    for d, (_rec, ref) in zip(state["ddp"], list(rec.ddps)):
        obj = ref()
        if not d.get("find_unused_parameters") or obj is None:
            continue
        try:
            data = obj._get_ddp_logging_data()
            d["unused_parameter_size"] = int(data.get("unused_parameter_size", 0))
            d["unused_seen"] = d["unused_parameter_size"] > 0
        except Exception:
            pass


def _site_dict(site):
    return None if site is None else {"path": site[0], "line": site[1], "function": site[2]}


def thread_stacks(rec: Recorder) -> list[dict[str, Any]]:
    """Every thread's Python stack, main thread first (taken from this background thread: no signal needed)."""
    names = {t.ident: t.name for t in threading.enumerate()}
    me = threading.get_ident()
    out = []
    for ident, frame in sys._current_frames().items():
        if ident == me:
            continue
        out.append({"name": names.get(ident, str(ident)), "main": ident == rec.main_thread_id,
                    "frames": frames_of(frame)})
    out.sort(key=lambda t: not t["main"])
    return out


@contextlib.contextmanager
def no_gc():
    """No garbage collection while this thread builds a state: the cyclic GC runs in whichever thread
    allocates, and the user's objects (a DDP model dropped by a sweep) must be finalized in the user's
    threads, not the probe's (a DDP reducer torn down from this thread aborted the rank at exit).
    Never held across a store call, so a stuck side channel cannot leave GC off."""
    was = gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


class Publisher(threading.Thread):
    """Daemon thread: connect to the watcher's store, post state, answer stack requests."""

    def __init__(self, rec: Recorder, address: str) -> None:
        super().__init__(name="ddp-doctor-probe", daemon=True)
        self.rec = rec
        host, _, port = address.rpartition(":")
        self.host, self.port = host or "127.0.0.1", int(port)
        self.store = self._channel()
        self.last_req = 0
        self.stopped = threading.Event()

    def _channel(self):
        """Signed, never-blocking client of the watcher's store (``ddp_doctor.channel``)."""
        import torch.distributed as dist

        from ddp_doctor.channel import SideChannel, job_secret

        def connect():
            return dist.TCPStore(self.host, self.port, is_master=False, timeout=timedelta(seconds=15),
                                 wait_for_workers=False)

        return SideChannel(connect=connect, secret=job_secret(), deadline=DEADLINE_S, give_up_s=GIVE_UP_S)

    def _state_json(self, *, with_stack: bool) -> str:
        with no_gc():
            state = snapshot(self.rec, with_stack=with_stack)
            state["side_channel"] = {"dropped": self.store.stats.dropped, "timeouts": self.store.stats.timeouts}
            return json.dumps(state, separators=(",", ":"), default=str)

    def publish(self, *, final: bool = False) -> None:
        self.store.set(f"ddpd/rank/{self.rec.rank}", self._state_json(with_stack=final))

    def _answer_requests(self) -> None:
        req = self.store.add("ddpd/req", 0)
        if req > self.last_req:
            self.last_req = req
            with no_gc():
                stacks = json.dumps({"threads": thread_stacks(self.rec)})
            self.store.set(f"ddpd/rank/{self.rec.rank}", self._state_json(with_stack=True))
            self.store.set(f"ddpd/stack/{self.rec.rank}/{req}", stacks)

    def _check_stop(self) -> None:
        """Embedded mode: the watcher in rank 0 decided; end this rank (and its loader workers)."""
        if os.environ.get("DDP_DOCTOR_STORE_EMBEDDED") != "1":
            return
        if self.store.check(["ddpd/stop"]):
            import signal

            try:
                import psutil

                for c in psutil.Process().children(recursive=True):
                    c.terminate()
            except Exception:
                pass
            os.kill(os.getpid(), signal.SIGTERM)

    def run(self) -> None:
        from ddp_doctor.channel import ChannelDown

        failures = 0
        while not self.stopped.is_set():
            try:
                self.publish()
                self._answer_requests()
                self._check_stop()
                failures = 0
            except ChannelDown:
                pass  # behind or overdue: this post is dropped (and counted); the next one may go through
            except Exception:
                failures += 1
            if self.store.lost or failures > 40:  # no watcher: record locally, training goes on
                return
            self.stopped.wait(INTERVAL)

    def final(self, wait_ack: float = 0.0) -> None:
        """Post the final state; optionally wait (<= wait_ack s) for the watcher to have taken the others' stacks.

        Never blocks on the side channel: each call has a deadline, and a channel that is behind
        (a call still stuck on an unanswering store) drops the post at once."""
        try:
            self.publish(final=True)
            if self.store.check(["ddpd/stop"]):
                wait_ack = 0.0  # the watcher has already decided; nobody will ack
            if wait_ack > 0:
                end = time.monotonic() + wait_ack
                while time.monotonic() < end:
                    if self.store.add(f"ddpd/ack/{ATTEMPT}/{self.rec.rank}", 0, deadline=end - time.monotonic()) > 0:
                        break
                    time.sleep(0.05)
        except Exception:
            pass
