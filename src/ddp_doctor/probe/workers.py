"""DataLoader workers found dead when the rank fails: which worker of which loader, killed by which signal.

The rank's own error about a dead worker depends on timing: torch's SIGCHLD handler raises "DataLoader
worker (pid N) is killed by signal: Killed." wherever the main thread is, but a batch the worker had
already queued can fail first ("Connection reset by peer" while the rank fetches its shared memory from
the dead worker).  The worker processes themselves say what happened either way: multiprocessing's own
``exitcode`` (its bookkeeping, so torch's later checks see the same status).
"""
from __future__ import annotations

import functools
import os
import signal
import time

from ddp_doctor.evidence import WorkerExit

_DATA_CODE = (os.sep + "utils" + os.sep + "data" + os.sep, os.sep + "multiprocessing" + os.sep)


def _through_loader(exc: BaseException) -> bool:
    """Did the error come out of the DataLoader's machinery (a worker's death may still be in flight)?"""
    tb = exc.__traceback__
    while tb is not None:
        if any(p in tb.tb_frame.f_code.co_filename for p in _DATA_CODE):
            return True
        tb = tb.tb_next
    return False


def _exits(procs, *, but_sigterm: bool = False) -> tuple[WorkerExit, ...]:
    """The worker processes among ``procs`` that died (not those torch itself terminated, with ``but_sigterm``)."""
    out = []
    for w in procs:
        code = w.exitcode if w is not None else None
        if code in (None, 0) or (but_sigterm and code == -signal.SIGTERM):
            continue
        sig = None
        if code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = f"signal {-code}"
        out.append(WorkerExit(int(w.pid), code, sig))
    return tuple(out)


def patch_shutdown(rec) -> None:
    """After torch shuts a DataLoader iterator's workers down (at the end of an epoch, or when a failing rank
    drops it while its error unwinds), keep the ones that had died on the loader's record."""
    from torch.utils.data import dataloader as dl_mod

    it_cls = dl_mod._MultiProcessingDataLoaderIter
    orig = it_cls._shutdown_workers
    if hasattr(orig, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig)
    def _shutdown_workers(self):
        try:
            return orig(self)
        finally:
            try:
                lr = getattr(self, "_ddpd_rec", None)
                exits = _exits(list(getattr(self, "_workers", ())), but_sigterm=True) if lr is not None else ()
                if exits:
                    lr.worker_exits = exits
                    rec.version += 1
            except Exception:
                pass

    _shutdown_workers.__ddp_doctor_wrapped__ = orig
    it_cls._shutdown_workers = _shutdown_workers


def note_dead_workers(rec, exc: BaseException, wait_s: float = 0.3) -> None:
    """When the rank fails: record, on each loader's record, its workers that died (iterators the failing
    program still holds; a dropped one was seen by ``patch_shutdown``).  For an error out of the DataLoader,
    give a worker being killed up to ``wait_s`` to become a corpse (its sockets close before it is one)."""
    deadline = time.monotonic() + (wait_s if _through_loader(exc) else 0.0)
    while True:
        found = False
        for lr in list(rec.loaders):
            try:
                exits = _exits([ref() for ref in list(lr.workers)])
            except Exception:
                continue
            if exits:
                lr.worker_exits = exits
                found = True
        if found or time.monotonic() >= deadline:
            if found:
                rec.version += 1
            return
        time.sleep(0.02)
