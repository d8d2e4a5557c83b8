"""Ranks die with their launcher: a SIGKILLed ``ddp-doctor run`` must not leave ranks training on.

``ddp-doctor run`` puts its own PID in ``DDP_DOCTOR_LAUNCHER_PID``; a rank whose parent is that
launcher asks Linux to SIGKILL it when the parent dies (``prctl(PR_SET_PDEATHSIG)``) and, as a
fallback for other systems and for the case the kernel cannot cover (the parent died before the
``prctl``), a daemon thread watches the parent PID and ends the rank and its DataLoader workers.
The workers get the same parent-death signal (their parent is the rank).  Nothing here runs when
the rank was started by another launcher (torchrun, mpirun): their lifetime is theirs to manage.
"""
from __future__ import annotations

import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
WATCH_S = 0.5


_prctl = None  # libc's prctl, looked up once in the rank: a forked worker calls it without a dlopen


def _libc_prctl():
    """dlopen() in a forked child can block for good on the loader's lock if another thread of the parent
    held it at the fork; so the rank looks prctl up and its DataLoader workers inherit the function."""
    global _prctl
    if _prctl is None:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """Linux only: have the kernel send ``sig`` to this process when its parent exits."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc_prctl()(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except Exception:
        return False


def _end_self() -> None:
    """The launcher is gone: end this rank's own children (loader workers), then the rank."""
    try:
        import psutil

        for c in psutil.Process().children(recursive=True):
            try:
                c.kill()
            except psutil.Error:
                pass
    except Exception:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def _watch(parent: int) -> None:
    ev = threading.Event()
    while not ev.wait(WATCH_S):
        if os.getppid() != parent:
            _end_self()


def tie_to_launcher() -> bool:
    """In a rank started by ``ddp-doctor run``: die with it.  Returns whether the rank is tied."""
    try:
        launcher = int(os.environ.get("DDP_DOCTOR_LAUNCHER_PID") or 0)
    except ValueError:
        return False
    if not launcher:
        return False
    parent = os.getppid()
    if parent != launcher:
        if parent == 1 or not _alive(launcher):
            _end_self()  # orphaned before we got here
        return False  # an intermediate process between us and the launcher: not ours to tie
    set_parent_death_signal()
    if os.getppid() != parent:  # died between the check and the prctl
        _end_self()
    threading.Thread(target=_watch, args=(parent,), name="ddp-doctor-lifeline", daemon=True).start()
    return True


# whether the thread now starting DataLoader workers is the rank's main thread (set by the loader hook
# just before torch forks them; a forked worker inherits the value).  The parent-death signal fires
# when the *thread* that forked the child ends, so a worker forked by a short-lived thread is left
# to torch's own worker watchdog.
forking_thread_is_main = False


if os.environ.get("DDP_DOCTOR_LAUNCHER_PID") and sys.platform.startswith("linux"):
    try:
        _libc_prctl()  # now, in the rank: its DataLoader workers will need it
    except Exception:
        pass


def tie_worker_to_rank() -> None:
    """In a DataLoader worker of a tied rank: the kernel kills it with the rank."""
    if os.environ.get("DDP_DOCTOR_LAUNCHER_PID") and forking_thread_is_main:
        set_parent_death_signal()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
