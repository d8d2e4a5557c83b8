"""``ddp-doctor check [--deadline S] [--report PATH] [--sizes ...] [torchrun options]``.

Pre-flight self-test: launches ``ddp_doctor.check.worker`` on the requested ranks/nodes
through torch's elastic launcher, follows every rank through a TCPStore side channel with
a per-test deadline, stops whatever it started, renders the result and exits 0 (all
passed) or 1 (a failure or an error finding); 2 on usage errors.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import time
from datetime import datetime, timezone

USAGE = """usage: ddp-doctor check [--deadline S] [--report PATH] [--sizes 4K,256K,4M] [--workers N]
                         [--batch-mb MB] [--backend gloo|nccl] [--verbose] [torchrun options]

Pre-flight self-test of the environment and of every rank's links. Launches itself on the
ranks/nodes that the torchrun options ask for (default: one rank per GPU, 2 ranks without GPU;
--standalone on one node) and runs
rendezvous, ring and every-pair send/recv, barrier, broadcast from every source, all_gather and
all_reduce (with correctness checks and bus bandwidth), plus an environment audit of every node.

options:
  --deadline S         per-test deadline in seconds (default 10): a test that does not finish
                       in time is reported, never waited on
  --report PATH        write the result as JSON (schema ddp-doctor/check/v1)
  --sizes LIST         all_reduce message sizes (default 4K,256K,4M)
  --workers N          DataLoader workers per rank the audit plans for (default 4)
  --batch-mb MB        bytes of one batch, for the /dev/shm estimate (default 32)
  --backend NAME       gloo or nccl (default: nccl on GPU, gloo otherwise)
  --rendezvous-timeout S  how long nodes may take to join (default 60)
  --verbose            show the launcher's own logging
Exit codes: 0 every test passed, 1 a failure or error finding, 2 usage error.
"""

# option -> (dest, takes value)
_OPTIONS = {
    "--deadline": ("deadline", True), "--report": ("report", True), "--sizes": ("sizes", True),
    "--workers": ("workers", True), "--batch-mb": ("batch_mb", True), "--backend": ("backend", True),
    "--rendezvous-timeout": ("rendezvous_timeout", True), "--verbose": ("verbose", False),
}


class UsageError(Exception):
    pass


def split_argv(argv: list[str]) -> tuple[dict[str, object], list[str]]:
    """Take ddp-doctor check's own options out of ``argv``; the rest are torchrun's."""
    ours: dict[str, object] = {"deadline": "10", "report": None, "sizes": None, "workers": "4",
                               "batch_mb": "32", "backend": None, "rendezvous_timeout": "60", "verbose": False}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, eq, value = arg.partition("=")
        name_us = name.replace("_", "-")
        if name_us in _OPTIONS:
            dest, takes = _OPTIONS[name_us]
            if not takes:
                ours[dest] = True
            elif eq:
                ours[dest] = value
            elif i + 1 < len(argv):
                i += 1
                ours[dest] = argv[i]
            else:
                raise UsageError(f"{name} needs a value")
        else:
            rest.append(arg)
        i += 1
    return ours, rest


def _torchrun_args(rest: list[str], rendezvous_timeout: float):
    from ddp_doctor.launch import parse_torchrun_args

    try:
        args = parse_torchrun_args(rest + ["ddp_doctor_check"])
    except SystemExit as exc:
        raise UsageError("bad torchrun options") from exc
    if args.training_script != "ddp_doctor_check" or args.training_script_args:
        raise UsageError("check runs its own tests: pass torchrun options only, no script")
    given = set(a.split("=")[0].replace("_", "-") for a in rest)
    if not ({"--rdzv-endpoint", "--master-port", "--master-addr", "--rdzv-backend"} & given) and not args.standalone:
        nn = str(args.nnodes)
        if nn in ("1", "1:1"):
            args.standalone = True   # a free port: never collide with another job on 29500
    if "--nproc-per-node" not in given and "--nproc_per_node" not in given:
        import torch

        # one rank per GPU, as training would use; 2 CPU ranks otherwise (enough to test a link)
        args.nproc_per_node = str(torch.cuda.device_count()) if torch.cuda.is_available() else "2"
    args.max_restarts = 0            # a restart would re-run the tests and hide the failure
    conf = args.rdzv_conf or ""
    if "join_timeout" not in conf:
        args.rdzv_conf = ",".join(x for x in (conf, f"join_timeout={int(rendezvous_timeout)}") if x)
    return args


def _failures(exc) -> dict[int, dict]:
    out = {}
    for rank, f in (getattr(exc, "failures", None) or {}).items():
        sig = None
        try:
            sig = f.signal_name() if f.exitcode is not None and f.exitcode < 0 else None
        except Exception:  # noqa: BLE001
            pass
        out[int(rank)] = {"local_rank": f.local_rank, "pid": f.pid, "exitcode": f.exitcode,
                          "signal": sig, "timestamp": f.timestamp}
    return out


def _describe(exc: BaseException, rendezvous_timeout: float, nnodes) -> str:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    error = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    if "Rendezvous" in type(exc).__name__ and "Timeout" in type(exc).__name__:
        error += f" — not all nodes joined within --rendezvous-timeout {rendezvous_timeout:g} s (--nnodes {nnodes})"
    return error


def _log_tail(logdir: str, rank: int, lines: int = 12) -> list[str] | None:
    path = os.path.join(logdir, f"rank{rank}.log")
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            text = fh.read().splitlines()
    except OSError:
        return None
    text = [t for t in text if t.strip()]
    return text[-lines:] or None


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    try:
        ours, rest = split_argv(argv)
        deadline = float(ours["deadline"])
        if deadline <= 0:
            raise UsageError("--deadline must be positive")
        from ddp_doctor.check import plan

        sizes = plan.parse_sizes(ours["sizes"]) if ours["sizes"] else list(plan.DEFAULT_SIZES)
        workers, batch_mb = int(ours["workers"]), float(ours["batch_mb"])
        rdzv_timeout = float(ours["rendezvous_timeout"])
        if ours["backend"] not in (None, "gloo", "nccl"):
            raise UsageError("--backend must be gloo or nccl")
    except (UsageError, ValueError) as exc:
        print(f"{USAGE}\nddp-doctor check: error: {exc}", file=sys.stderr)
        return 2
    from ddp_doctor.report.files import refuse_unwritable

    refused = refuse_unwritable("ddp-doctor check", {"--report": ours["report"]})
    if refused:  # before any rank starts
        print(refused, file=sys.stderr)
        return 2
    return run_check(rest, deadline=deadline, sizes=sizes, workers=workers, batch_bytes=int(batch_mb * 1024 ** 2),
                     backend=ours["backend"], report_path=ours["report"], verbose=bool(ours["verbose"]),
                     rendezvous_timeout=rdzv_timeout)


def run_check(rest: list[str], *, deadline: float = 10.0, sizes=None, workers: int = 4,
              batch_bytes: int = 32 << 20, backend: str | None = None, report_path: str | None = None,
              verbose: bool = False, rendezvous_timeout: float = 60.0, console=None) -> int:
    from ddp_doctor.check import audit, plan
    from ddp_doctor.check.worker import CONFIG_ENV

    from ddp_doctor.check import faults

    try:
        faults.from_env()
    except ValueError as exc:
        print(f"ddp-doctor check: error: {exc}", file=sys.stderr)
        return 2
    user_env = audit.user_env()      # before torchrun adds its own (OMP_NUM_THREADS, ...)
    if not verbose:
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    try:
        args = _torchrun_args(rest, rendezvous_timeout)
    except UsageError as exc:
        print(f"{USAGE}\nddp-doctor check: error: {exc}", file=sys.stderr)
        return 2
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    from ddp_doctor.channel import ensure_job_secret
    from ddp_doctor.check.results import check_report
    from ddp_doctor.check.monitor import Monitor, stop_all_descendants
    from ddp_doctor.launch import launch
    from ddp_doctor.report import check_view

    # the ranks and this launcher sign what they post (run's store, ddp_doctor.channel): one node's secret is
    # made here; several nodes need the user's, on every node
    ensure_job_secret(multi_node=int(str(args.nnodes).split(":")[-1]) > 1 and not args.standalone)
    logdir = tempfile.mkdtemp(prefix="ddp-doctor-check-")
    monitor = Monitor(deadline, startup_timeout=rendezvous_timeout + 60.0, rendezvous_timeout=rendezvous_timeout)
    config = {"store": monitor.address, "deadline": deadline, "rendezvous_timeout": rendezvous_timeout,
              "sizes": list(sizes or plan.DEFAULT_SIZES),
              "workers": workers, "batch_bytes": batch_bytes, "backend": backend, "logdir": logdir,
              "user_env": user_env}
    saved_env = dict(os.environ)
    os.environ[CONFIG_ENV] = json.dumps(config)
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    t0 = time.monotonic()
    check_view.print_start(args, deadline, console=console)
    if not verbose:
        logging.disable(logging.CRITICAL)
    saved_sigterm = signal.getsignal(signal.SIGTERM)
    monitor.start()
    failures: dict[int, dict] = {}
    error = None
    try:
        try:
            launch(args, "ddp_doctor.check.worker")
        except ChildFailedError as exc:
            failures = _failures(exc)
        except Exception as exc:  # noqa: BLE001 - rendezvous timeout, store errors: report, don't crash
            if not monitor.watchdog_fired:
                error = _describe(exc, rendezvous_timeout, args.nnodes)
        finally:
            monitor.mark_launch_returned()
            # torch's agent left its SIGTERM handler installed: a late signal must not raise here
            signal.signal(signal.SIGTERM, lambda *_: None)
    except Exception:  # noqa: BLE001 - the watchdog's SIGTERM arriving on the way out
        pass
    finally:
        logging.disable(logging.NOTSET)
        os.environ.clear()
        os.environ.update(saved_env)
    monitor.job_finished(error)
    snapshot = monitor.join(timeout=30.0)
    leftovers = stop_all_descendants()
    snapshot["failures"] = failures
    if error and not snapshot.get("job_error"):
        snapshot["job_error"] = error
    report = check_report(snapshot, deadline=deadline, nnodes_hint=int(str(args.nnodes).split(":")[-1]))
    for r in report["ranks"]:
        if r["state"] != "ok":
            r["log_tail"] = _log_tail(logdir, r["rank"])
    report.update({"command": ["ddp-doctor", "check", *rest], "started_at": started_at,
                   "duration_s": round(time.monotonic() - t0, 3),
                   "stopped_processes": snapshot.get("killed", []) + leftovers})
    if snapshot.get("watchdog"):
        report["watchdog"] = snapshot["watchdog"]
    shutil.rmtree(logdir, ignore_errors=True)
    from ddp_doctor.report.files import save_reports

    saved = save_reports(report, report_path, None)
    check_view.print_check(report, console=console)
    signal.signal(signal.SIGTERM, saved_sigterm if saved_sigterm is not None else signal.SIG_DFL)
    for s in saved:
        if not s.ok:
            print(s.notice(), file=sys.stderr)
    return int(report["exit_code"])
