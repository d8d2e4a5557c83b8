"""What the launcher tests share: free ports, processes started in sessions of their own (all killed at
teardown), the environment that runs this checkout's ddp_doctor, reports and the expected findings."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SRC = ROOT / "src"


def free_port() -> int:
    """A free port whose next one is free too: a rank-0 watcher under another launcher listens on
    MASTER_PORT + 1 (tests run two at a time)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 65535:
            with socket.socket() as t:
                try:
                    t.bind(("127.0.0.1", port + 1))
                except OSError:
                    continue
            return port


def line_of(script: Path, marker: str) -> int:
    return next(i for i, s in enumerate(script.read_text().splitlines(), 1) if marker in s)


class Procs:
    """Processes started in their own sessions, output to files; all killed at teardown."""

    def __init__(self, tmp: Path):
        self.tmp, self.procs, self.logs = tmp, [], []

    def start(self, cmd: list[str], env: dict, cwd: Path | None = None) -> subprocess.Popen:
        log = self.tmp / f"p{len(self.procs)}.log"
        self.logs.append(log)
        p = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=open(log, "w"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs.append(p)
        return p

    def text(self) -> str:
        return "".join(log.read_text(errors="replace") for log in self.logs)

    def wait_for(self, marker: str, count: int, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.text().count(marker) < count:
            assert time.monotonic() < deadline, self.text()[-3000:]
            time.sleep(0.2)

    def wait_all(self, timeout: float = 120) -> list[int]:
        return [p.wait(timeout=timeout) for p in self.procs]

    def kill(self) -> None:
        for p in self.procs:
            kill_tree(p)


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL a launcher and every process under it: torch's agent starts each rank in its own session,
    so killing the launcher's process group alone leaves the ranks running."""
    import psutil

    try:
        tree = psutil.Process(proc.pid).children(recursive=True)
    except psutil.Error:
        tree = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for c in tree:
        try:
            c.kill()
        except psutil.Error:
            pass
    proc.wait(timeout=30)
    psutil.wait_procs(tree, timeout=10)


def rank_env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", NO_COLOR="1", **extra)


def accelerate_launch(script: Path, *args: str) -> list[str]:
    """``accelerate launch`` of ``script`` on 2 CPU processes, no config file, on a free port."""
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port",
            str(free_port()), str(script), *args]


def wait_report(path: Path, procs: Procs, timeout: float = 150) -> dict:
    """The report once written (the embedded watcher replaces the file atomically)."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, procs.text()[-4000:]
        time.sleep(0.2)
    return json.loads(path.read_text())


# what a healthy job's output must not hold, of ours: c10d's store and socket warnings (a TCPStore call to a
# closed store prints "[rank1]:[W... TCPStore.cpp:125] [c10d] recvValue failed ..." and a C++ stack trace), a
# Python traceback, a warning from ddp_doctor's own files.  (Other "[W" lines are the job's: the HF Trainer's
# DDP warns of its find_unused_parameters=True.)
NOISE = ("TCPStore", "socket.cpp", "Exception raised from", "Traceback", "ddp_doctor/")


def noise(text: str) -> list[str]:
    return [line for line in text.splitlines() if any(n in line for n in NOISE)]


def ended(procs: Procs, mode: str, timeout: float = 90) -> None:
    """The job ended by itself (its launcher's exit status: 0 when healthy, else not), and a healthy one
    printed nothing of ours (``NOISE``) on any rank (every rank's output is in the logs)."""
    codes = procs.wait_all(timeout=timeout)
    if mode == "ok":
        assert codes == [0] * len(codes), procs.text()[-4000:]
        assert noise(procs.text()) == [], noise(procs.text())
    else:
        assert all(c != 0 for c in codes), (codes, procs.text()[-4000:])


def expect(rep: dict, script: Path, mode: str, launcher: str) -> None:
    """``mode`` "ok": clean; "barrier": rank 0's lone barrier named at its line; "main_only": the line where
    rank 0 alone went on (the others finished); "raise": rank 1's raise."""
    assert rep["launcher"] == launcher, rep.get("launcher")
    errors = [f for f in rep["findings"] if f["severity"] == "error"]
    if mode == "ok":
        assert (rep["verdict"], errors) == ("ok", []), rep["findings"]
        return
    assert errors, rep["verdict"]
    f = errors[0]
    assert f["location"]["path"].endswith(script.name) and f["location"]["line"] == line_of(script, f"expect: {mode}"), f
    if mode == "barrier":
        assert f["code"] in ("DDP201", "DDP203") and 0 in f["ranks"], f
    elif mode == "main_only":  # rank 0 alone went on into a collective; rank 1 finished: that rank is named
        assert f["code"] in ("DDP101", "DDP201", "DDP204") and "rank 0 wait" in f["message"], f  # waits or waited
    else:
        assert (rep["verdict"], f["code"], f["ranks"]) == ("crash", "DDP204", [1]), f
        assert "RuntimeError" in f["message"], f["message"]


@dataclass
class Case:
    """One job of a launcher's shared run: its processes (output, exit statuses) and its report."""
    procs: Procs
    report: dict


@contextmanager
def running(tmp: Path, modes: list[str], start: Callable[[Procs, str, Path], None]) -> Iterator[dict[str, Case]]:
    """Every mode's job started at once (``start(procs, mode, report_path)``, each in a directory of its own),
    then each one's report; every process killed on leaving.  A module fixture's: the jobs' start-up,
    diagnosis and end overlap, so one launcher's cases cost CI about one job's waits."""
    cases: dict[str, Case] = {}
    try:
        for mode in modes:
            (tmp / mode).mkdir()
            cases[mode] = Case(Procs(tmp / mode), {})
            start(cases[mode].procs, mode, tmp / mode / "r.json")
        for mode, case in cases.items():
            case.report = wait_report(tmp / mode / "r.json", case.procs, timeout=240)
        yield cases
    finally:
        for case in cases.values():
            case.procs.kill()
