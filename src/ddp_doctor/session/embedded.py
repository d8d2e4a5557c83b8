"""The watcher inside rank 0, for jobs started by another launcher (plain torchrun, mpirun, SLURM srun...).

Activation: ``ddp_doctor.watch()`` in the rank's program, or ``-m ddp_doctor.probe`` in front of the script
(``torchrun --nproc-per-node 2 -m ddp_doctor.probe train.py``).  Without ``ddp-doctor run`` around it,
there is no launcher-side watcher, so rank 0 hosts the side-channel TCPStore (once the default group
exists, on a port the OS picks, announced in torch's store; before, on ``MASTER_ADDR:(MASTER_PORT+1)``:
see ``Probe._embedded``) and runs the same :class:`~ddp_doctor.watcher.Watcher`
in a thread; the other ranks publish to it.  On a diagnosis rank 0 writes the report, prints it, and sets
``ddpd/stop``: every probe then terminates its own rank and DataLoader workers, so the launcher sees the
job fail instead of hanging until a timeout.  A job that ends without one gets its report once rank 0
finished and the others posted their end (or ``FINAL_WAIT_S`` passed).  The report goes to
``DDP_DOCTOR_REPORT`` (default ``ddp-doctor-report.json``) in the launch directory
(``launcher.report_path``; ``DDP_DOCTOR_HTML`` optional), its absolute path printed.
``DDP_DOCTOR_HANG_TIMEOUT`` sets the stall limit (default 90 s): a stall is a live diagnosis on rank 0's
stderr and the job runs on (stopped only on proof); ``DDP_DOCTOR_STOP_ON_STALL=1`` stops it at the limit.
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

from ddp_doctor.store import CLOSED, CLOSING


FINAL_WAIT_S = 10.0  # rank 0 finished: how long its report waits for the other ranks' last posts
LET_GO_S = 2.0       # ... then how long it waits for the ranks still posting to let go of its store


def start_in_rank0(address: str, world: int):
    """Host the store (port 0: one the OS picks) and start the watcher thread (called by the probe on global
    rank 0); returns (what the probe runs once rank 0 finished: the report of a job the watcher had no
    reason to stop, the port the store listens on)."""
    from ddp_doctor.store import host_store
    from ddp_doctor.watcher import Watcher

    store, port = host_store(int(address.rpartition(":")[2]))
    _check_destinations()
    ht = os.environ.get("DDP_DOCTOR_HANG_TIMEOUT")
    own_dir = not os.environ.get("DDP_DOCTOR_DIR")
    run_dir = os.environ.get("DDP_DOCTOR_DIR") or tempfile.mkdtemp(prefix="ddp-doctor-")
    if own_dir:
        atexit.register(shutil.rmtree, run_dir, True)
    t0 = time.time()
    w = Watcher(store, world_size=world, hang_timeout=float(ht) if ht else None, run_dir=run_dir, is_host=True,
                stop_on_stall=os.environ.get("DDP_DOCTOR_STOP_ON_STALL", "") not in ("", "0"))
    from ddp_doctor.session.lint_job import LintJob

    w.lint_job = LintJob(_script())  # beside the job, in a child process: the decision lines lint gives run
    reported = threading.Event()
    w.on_decision = lambda decision: _report_and_stop(w, store, t0, run_dir if own_dir else None, reported)
    w.start()
    threading.Thread(target=_warnings, args=(w,), name="ddp-doctor-warn", daemon=True).start()
    _keep.append((store, w))
    return (lambda: _final_report(w, store, t0, reported)), port


def _rank_ended(v) -> bool:
    return v.state is not None and (v.state.done or v.state.exc is not None or v.state.exit_code is not None)


def _ended(w) -> bool:
    return all(_rank_ended(v) for v in w.views.values())


def _final_report(w, store, t0: float, reported: threading.Event) -> None:
    """Rank 0 finished: once every rank posted its end (at most FINAL_WAIT_S), the job's report, unless the
    watcher decided (then wait for its report: the process may exit right after this).  Then the ranks still
    posting let go of the store before this process (and the store with it) ends."""
    end = time.monotonic() + FINAL_WAIT_S
    while w.decision is None and time.monotonic() < end:
        with w.lock:
            w.read_states()
        if _ended(w):
            break
        w.stopping.wait(0.2)
    if w.decision is not None:
        reported.wait(15.0)
        return
    w.stopping.set()
    w.join(5.0)
    if w.decision is not None:  # decided while stopping: its report is being written
        reported.wait(15.0)
        return
    _write_report(w, t0)
    _let_go(w, store)


def _let_go(w, store) -> None:
    """Ask the ranks that have not ended (their publishers still post) to stop calling the store, and wait
    (<= LET_GO_S) until they said they did: a call to a store whose server is gone makes torch's client print
    a C++ stack trace in that rank, after a job that ran clean."""
    try:
        with w.lock:
            w.read_states()
        posting = sum(1 for r, v in w.views.items() if r != 0 and not _rank_ended(v))
        if not posting:
            return
        store.add(CLOSING, 1)
        end = time.monotonic() + LET_GO_S
        while store.add(CLOSED, 0) < posting and time.monotonic() < end:
            time.sleep(0.05)
    except Exception:
        pass


def _report_paths() -> dict[str, str | None]:
    """Where the report (and the HTML page) go: absolute, from the launch directory (``launcher``)."""
    from ddp_doctor.session import launcher

    return {"DDP_DOCTOR_REPORT": launcher.report_path(), "DDP_DOCTOR_HTML": launcher.report_path("DDP_DOCTOR_HTML", None)}


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
        view.warn(w.judge.suspicion, stall=w.stalls[-1] if w.stall_decision is not None and w.stalls else None)


_keep: list[Any] = []


def _write_report(w, t0: float) -> None:
    try:
        from ddp_doctor.session import Job, launcher

        w.read_states()
        job = Job.for_report(w, argv=list(sys.argv), script=sys.argv[0] if sys.argv else "", t0=t0)
        lint = w.lint_job.findings() if getattr(w, "lint_job", None) is not None else []
        report = job.run_report(None, lint, time.monotonic())
        report["command"] = _command()
        report["launcher"] = launcher.detect()
        paths = _report_paths()
        report["report_path"] = paths["DDP_DOCTOR_REPORT"]
        job.own = {"--report": paths["DDP_DOCTOR_REPORT"], "--html": paths["DDP_DOCTOR_HTML"]}
        job.emit(report, True)  # (prints where it wrote the report)
    except Exception as e:  # never let the watcher take the job down silently
        print(f"ddp-doctor: embedded watcher could not write the report: {e!r}", file=sys.stderr)


def _script() -> str | None:
    """The user's training script: this process's own, else (a spawned rank) its parent's."""
    for arg in [*(sys.argv[:1]), *_command()]:
        if isinstance(arg, str) and arg.endswith(".py") and os.path.isfile(arg):
            return os.path.abspath(arg)
    return None


def _command() -> list[str]:
    """The command the user ran: a spawned rank's own (``mp.spawn``, ddp_spawn: ``-c "from multiprocessing.spawn
    import spawn_main ..." --multiprocessing-fork``) says nothing, its parent's does."""
    own = list(getattr(sys, "orig_argv", None) or [sys.executable, *sys.argv])
    if "--multiprocessing-fork" in own:
        try:
            import psutil

            return psutil.Process().parent().cmdline()
        except Exception:
            pass
    return own


def _report_and_stop(w, store, t0: float, scratch: str | None, reported: threading.Event) -> None:
    time.sleep(0.5)  # let failing ranks post their final state
    _write_report(w, t0)
    reported.set()
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)
    try:
        from ddp_doctor.store import STOP

        store.set(STOP, "1")
    except Exception:
        pass
