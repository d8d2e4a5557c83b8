"""The watcher inside rank 0, for jobs started by another launcher (plain torchrun, mpirun, SLURM srun...).

Activation: put ``-m ddp_doctor.probe`` in front of the script (``torchrun --nproc-per-node 2 -m
ddp_doctor.probe train.py``).  Without ``ddp-doctor run`` around it, there is no launcher-side watcher,
so rank 0 hosts the side-channel TCPStore on ``MASTER_ADDR:(MASTER_PORT+1)`` (``DDP_DOCTOR_PORT``
overrides) and runs the same :class:`~ddp_doctor.watch.Watcher` in a thread; the other ranks publish to
it.  On a diagnosis rank 0 writes the report (``DDP_DOCTOR_REPORT``, default ``ddp-doctor-report.json``;
``DDP_DOCTOR_HTML`` optional), prints it, and sets ``ddpd/stop``: every probe then terminates its own rank
and DataLoader workers, so the launcher sees the job fail instead of hanging until a timeout.
``DDP_DOCTOR_HANG_TIMEOUT`` sets the hang limit (default adaptive).
"""
from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any


def start_in_rank0(address: str) -> None:
    """Host the store and start the watcher thread (called by the probe on global rank 0)."""
    from ddp_doctor.store import host_store
    from ddp_doctor.watch import Watcher

    store, _ = host_store(int(address.rpartition(":")[2]))
    _check_destinations()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    ht = os.environ.get("DDP_DOCTOR_HANG_TIMEOUT")
    own_dir = not os.environ.get("DDP_DOCTOR_DIR")
    run_dir = os.environ.get("DDP_DOCTOR_DIR") or tempfile.mkdtemp(prefix="ddp-doctor-")
    if own_dir:
        atexit.register(shutil.rmtree, run_dir, True)
    t0 = time.time()
    w = Watcher(store, world_size=world, hang_timeout=float(ht) if ht else None, run_dir=run_dir, is_host=True)
    w.on_decision = lambda decision: _report_and_stop(w, store, decision, t0, run_dir if own_dir else None)
    w.start()
    threading.Thread(target=_warnings, args=(w,), name="ddp-doctor-warn", daemon=True).start()
    _keep.append((store, w))


def _report_paths() -> dict[str, str | None]:
    return {"DDP_DOCTOR_REPORT": os.environ.get("DDP_DOCTOR_REPORT", "ddp-doctor-report.json"),
            "DDP_DOCTOR_HTML": os.environ.get("DDP_DOCTOR_HTML")}


def _check_destinations() -> None:
    """Say at the start, in one line, that the report cannot go where asked (the job is the user's: it runs
    anyway, and a report written at the end goes to a fallback it names then)."""
    from ddp_doctor.report.files import refuse_unwritable

    problem = refuse_unwritable("ddp-doctor", _report_paths())
    if problem:
        print(f"{problem} (the job runs; a report would go to a fallback named then)", file=sys.stderr)


def _warnings(w) -> None:
    """The live warnings (a rank keeps the others waiting) on rank 0's stderr, a line when one starts or
    changes and every 15 s while it lasts: no live table inside the user's own output."""
    try:
        from ddp_doctor.report.terminal import LiveView
    except ImportError:
        return
    view = LiveView(w.world_size, file=sys.stderr, color=False)
    while not w.stopping.wait(1.0) and w.decision is None:
        view.warn(w.judge.suspicion)


_keep: list[Any] = []


def _report_and_stop(w, store, decision, t0: float, scratch: str | None = None) -> None:
    try:
        from ddp_doctor.session import Job

        time.sleep(0.5)  # let failing ranks post their final state
        w.read_states()
        job = Job.for_report(w, argv=list(sys.argv), script=sys.argv[0] if sys.argv else "", t0=t0)
        report = job.build_report(None, [], time.monotonic())
        report["command"] = [sys.executable, "-m", "ddp_doctor.probe", *sys.argv]
        paths = _report_paths()
        job.own = {"--report": paths["DDP_DOCTOR_REPORT"], "--html": paths["DDP_DOCTOR_HTML"]}
        job.emit(report, True)
    except Exception as e:  # never let the watcher take the job down silently
        print(f"ddp-doctor: embedded watcher could not write the report: {e!r}", file=sys.stderr)
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        from ddp_doctor.store import STOP

        store.set(STOP, "1")
    except Exception:
        pass
