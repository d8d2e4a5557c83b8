"""Ctrl-C (SIGINT to the whole process group), SIGTERM or SIGHUP to `ddp-doctor run`: the signal goes on to
the ranks as under torchrun, every rank's stack is taken, the report says `interrupted` with no finding
blaming the user's code, the exit code is 128+N, and no process is left."""
from __future__ import annotations

import json
import os
import signal

import psutil
import pytest

from conftest import SCRIPTS, alive, poll, ranks_of, start_run

pytestmark = [pytest.mark.scenario, pytest.mark.timing]  # real jobs signalled mid-run: alone, in the full tier


@pytest.mark.parametrize("sig,group,code", [(signal.SIGINT, True, 130), (signal.SIGTERM, False, 143),
                                            (signal.SIGHUP, False, 129)])
def test_interrupted_job(tmp_path, cleanup, sig, group, code):
    report = tmp_path / "r.json"
    run = start_run(["--quiet", "--no-lint", "--report", str(report), "--nproc-per-node", "2",
                     str(SCRIPTS / "long_train.py")])
    cleanup.append(psutil.Process(run.pid))
    found = poll(lambda: [r for r in ranks_of(run.pid) if r.children()] if len(ranks_of(run.pid)) == 2 else None, 90)
    assert found and len(found) == 2, run.poll()
    everything = found + [c for r in found for c in r.children()]
    cleanup.extend(everything)
    if group:
        os.killpg(run.pid, sig)  # Ctrl-C in a terminal: the foreground process group gets SIGINT
    else:
        os.kill(run.pid, sig)
    out = run.communicate(timeout=120)[0]
    assert run.returncode == code, out[-3000:]
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "interrupted" and rep["exit_code"] == code, (rep["verdict"], rep["findings"])
    assert rep["findings"] == []
    assert all(r["stack"] for r in rep["ranks"]), [r["stack"] for r in rep["ranks"]]
    assert poll(lambda: not [p for p in everything if alive(p)], 10), [p.pid for p in everything if alive(p)]


def test_exit_code_the_failing_ranks_agree_on(tmp_path):
    report = tmp_path / "r.json"
    run = start_run(["--quiet", "--no-lint", "--report", str(report), "--nproc-per-node", "2",
                     str(SCRIPTS / "every_rank_exits_3.py")])
    out = run.communicate(timeout=120)[0]
    assert run.returncode == 3, out[-3000:]
    rep = json.loads(report.read_text())
    assert rep["exit_code"] == 3 and rep["verdict"] == "crash", (rep["verdict"], rep["exit_code"])
