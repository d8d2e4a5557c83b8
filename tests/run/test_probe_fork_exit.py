"""What the probe leaves at a fork and at the rank's end (real forks and a real store, no ranks): a DataLoader
worker gets the cyclic collector on and its parent-death signal without a dlopen (which can block for good
in a forked child); the rank's last word reaches the watcher even while its publisher is in a store call."""
from __future__ import annotations

import gc
import os

from ddp_doctor.probe import lifeline
from ddp_doctor.probe.publisher import no_gc


def _in_child(check) -> int:
    """Fork; the child exits 0 when ``check()`` is true, 1 when false, 2 when it raised; the exit code."""
    pid = os.fork()
    if pid == 0:
        try:
            code = 0 if check() else 1
        except BaseException:
            code = 2
        os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_a_worker_forked_while_the_probe_paused_the_collector_has_it_back():
    assert gc.isenabled()
    with no_gc():
        assert not gc.isenabled()
        assert _in_child(gc.isenabled) == 0
    assert gc.isenabled()


def test_a_user_who_switched_the_collector_off_keeps_it_off_in_workers():
    gc.disable()
    try:
        with no_gc():
            pass
        assert _in_child(lambda: not gc.isenabled()) == 0
    finally:
        gc.enable()


def test_the_parent_death_signal_needs_no_dlopen_in_the_worker(monkeypatch):
    import ctypes

    lifeline._libc_prctl()  # what the rank does when ddp-doctor run started it

    def no_dlopen(*a, **k):
        raise AssertionError("dlopen in a forked child")

    def child() -> bool:
        monkeypatch.setattr(ctypes, "CDLL", no_dlopen)
        return lifeline.set_parent_death_signal(0)  # (signal 0: clears it again)

    assert _in_child(child) == 0


def test_the_final_post_waits_for_the_publishers_post_in_flight(monkeypatch):
    """A rank that ends while its publisher thread is in a store call: the final post is made after it, not
    dropped for being behind (the watcher would keep a state a step old: a healthy job judged uneven)."""
    import json
    import threading
    import time

    from ddp_doctor import store as side
    from ddp_doctor.probe.publisher import Publisher
    from ddp_doctor.probe.recorder import Recorder

    monkeypatch.setenv("DDP_DOCTOR_SECRET", "t" * 32)
    host, port = side.host_store()
    rec = Recorder()
    pub = Publisher(rec, f"127.0.0.1:{port}")
    in_call = threading.Event()
    plain_publish = pub.publish

    def slow_publish(*, final=False):
        if not final:  # the thread's own post, slowed inside the channel's call
            pub.store._call(lambda s: (in_call.set(), time.sleep(0.5), s.set("slow", b"x")))
        plain_publish(final=final)

    monkeypatch.setattr(pub, "publish", slow_publish)
    pub.start()
    assert in_call.wait(20), "the publisher never connected"
    rec.done, rec.exit_code = True, 0
    pub.stop()
    pub.final()
    state = json.loads(host.get(side.rank_key(rec.rank)))
    assert state["done"] is True and state["exit_code"] == 0
    assert pub.store.stats.dropped == 0
