"""A SIGKILLed `ddp-doctor run` takes its ranks and their DataLoader workers with it (no orphans)."""
from __future__ import annotations

import os
import signal

import psutil
import pytest

from conftest import SCRIPTS, alive, poll, ranks_of, start_run

pytestmark = pytest.mark.scenario  # real multi-rank jobs: the full tier (make test), not test-fast


def test_ranks_die_with_sigkilled_launcher(cleanup):
    run = start_run(["--quiet", "--no-lint", "--nproc-per-node", "2", str(SCRIPTS / "long_train.py")])
    cleanup.append(psutil.Process(run.pid))
    everything: list[psutil.Process] = []
    try:
        def ranks_with_workers():
            ranks = ranks_of(run.pid)
            if len(ranks) < 2:
                return None
            workers = [c for r in ranks for c in r.children()]
            return (ranks, workers) if len(workers) >= 2 else None

        found = poll(ranks_with_workers, 90)
        assert found, f"ranks did not start: {run.poll()}"
        ranks, workers = found
        everything = ranks + workers
        cleanup.extend(everything)
        os.kill(run.pid, signal.SIGKILL)
        run.wait(10)
        left = poll(lambda: not [p for p in everything if alive(p)], 5.0)
        assert left, f"still running 5 s after the launcher was SIGKILLed: {[p.pid for p in everything if alive(p)]}"
    finally:
        for p in everything:  # (only when the assertion failed) they hold the output pipe open
            if alive(p):
                p.kill()
        if run.poll() is None:
            run.kill()
        run.communicate()
