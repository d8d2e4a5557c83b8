"""Real hung 2-rank jobs under plain torchrun for the attach tests; each is killed in teardown."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
SCRIPTS = HERE / "scripts"
sys.path.append(str(HERE.parent / "launchers"))  # appended: this directory's conftest stays the one imported

from launch_helpers import free_port, kill_tree  # noqa: E402 - the one port picker and process-tree kill of the tests


class HungJob:
    """A torchrun job started in its own session; ``wait_for(text, n)`` polls its output."""

    def __init__(self, script: str, tmp: Path, nproc: int = 2, launcher_args: list[str] | None = None):
        self.log = tmp / f"{script}.{time.monotonic_ns()}.log"
        self.out = open(self.log, "w")
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
               *(launcher_args or ["--rdzv-endpoint", f"127.0.0.1:{free_port()}"]), str(SCRIPTS / script)]
        env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
        self.proc = subprocess.Popen(cmd, cwd=SCRIPTS, env=env, stdout=self.out, stderr=subprocess.STDOUT,
                                     start_new_session=True)

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_for(self, marker: str, count: int, timeout: float = 90.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.text().count(marker) >= count:
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"job ended early ({self.proc.returncode}):\n{self.text()[-3000:]}")
            time.sleep(0.2)
        raise AssertionError(f"{marker!r} x{count} not seen in {timeout}s:\n{self.text()[-3000:]}")

    def tree(self) -> dict[int, str]:
        """{pid: status} of the launcher and everything under it."""
        import psutil

        root = psutil.Process(self.proc.pid)
        out = {}
        for p in [root] + root.children(recursive=True):
            try:
                out[p.pid] = p.status()
            except psutil.Error:
                pass
        return out

    def kill(self) -> None:
        kill_tree(self.proc)
        self.out.close()


@pytest.fixture
def hung_job(tmp_path):
    jobs: list[HungJob] = []

    def start(script: str, nproc: int = 2, launcher_args: list[str] | None = None) -> HungJob:
        job = HungJob(script, tmp_path, nproc, launcher_args)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.kill()


def run_attach(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), NO_COLOR="1")
    return subprocess.run([sys.executable, "-m", "ddp_doctor", "attach", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)
