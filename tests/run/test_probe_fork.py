"""What a DataLoader worker inherits from the probe at its fork (real forks, no ranks): the cyclic collector
on, and the parent-death signal set without a dlopen (which can block for good in a forked child)."""
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
