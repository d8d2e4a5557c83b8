"""Signs of life of a rank beyond its own counters: is a rank that makes no step progress slow or stuck?

Sampled by the publisher thread at each publish (a few µs plus small /proc reads):
the CPU time and the bytes read + written of the rank's *training thread* (the thread that last ran
the model, the loader or the optimizer; the main thread until then), the CPU time of its DataLoader
workers, and a signature of the training thread's Python stack.  The probe's own threads never count,
nor do other background threads (loggers, progress bars, metric uploaders would otherwise make every
stuck rank look alive).
"""
from __future__ import annotations

import os
import threading
import time

from ddp_doctor.evidence import Activity
from ddp_doctor.probe.stackdump import signature

_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_MAX_WORKERS = 16


def _thread_cpu(ident: int) -> float:
    try:
        return time.clock_gettime(time.pthread_getcpuclockid(ident))
    except (OSError, AttributeError, OverflowError):
        return 0.0


def _native_id(ident: int) -> int | None:
    if ident == threading.main_thread().ident:
        return os.getpid()
    for t in threading.enumerate():
        if t.ident == ident:
            return t.native_id
    return None


def _io_bytes(native: int | None) -> int:
    if native is None:
        return 0
    try:
        with open(f"/proc/self/task/{native}/io", "rb") as f:
            total = 0
            for line in f:
                if line.startswith((b"rchar", b"wchar")):
                    total += int(line.split()[1])
            return total
    except (OSError, ValueError):
        return 0


def _proc_cpu(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
        fields = raw[raw.rindex(b")") + 2:].split()
        return (int(fields[11]) + int(fields[12])) / _TICK  # utime + stime
    except (OSError, ValueError, IndexError):
        return 0.0


def sample(rec, stacks: dict[int, bytes]) -> Activity:
    """The rank's signs of life now (never raises); ``stacks``: every thread's stack text (stackdump)."""
    try:
        ident = rec.train_thread or rec.main_thread_id
        if ident not in stacks:  # the training thread ended: back to the main thread
            ident = rec.main_thread_id
        workers = 0.0
        loader = rec.last_loader
        if loader is not None:
            for pid in list(loader.worker_pids)[:_MAX_WORKERS]:
                workers += _proc_cpu(pid)
        native = _native_id(ident)
        return Activity(round(_thread_cpu(ident), 4), _io_bytes(native), round(workers, 3),
                        signature(stacks.get(ident)), native)
    except Exception:
        return Activity()
