"""Activation under another launcher: plain torchrun with `-m ddp_doctor.probe` in front of the script.

Rank 0 hosts the side channel and the watcher (ddp_doctor.session.embedded); the hang is diagnosed, the
report written to DDP_DOCTOR_REPORT, and every rank ended (the launcher sees the failure)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.scenario
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def test_plain_torchrun_with_probe_module(tmp_path):
    report = tmp_path / "r.json"
    script = HERE / "scripts" / "barrier_rank0.py"
    tag = uuid.uuid4().hex  # finds this job's processes (the same script may run in another test meanwhile)
    env = dict(os.environ, PYTHONPATH=str(SRC), DDP_DOCTOR_REPORT=str(report), DDP_DOCTOR_PORT="29731",
               DDP_DOCTOR_TEST_TAG=tag)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-endpoint", "127.0.0.1:29730",
           "-m", "ddp_doctor.probe", str(script)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         start_new_session=True)
    try:
        out = p.communicate(timeout=120)[0]
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)
        out = p.communicate()[0]
    assert p.returncode != 0, out[-2000:]
    assert report.exists(), out[-3000:]
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "hang"
    f = next(f for f in rep["findings"] if f["code"] == "DDP201")
    assert f["ranks"] == [0] and f["location"]["line"] == 19  # `if step == 10 and rank == 0:`
    import psutil

    def mine(q: psutil.Process) -> bool:
        try:
            return q.environ().get("DDP_DOCTOR_TEST_TAG") == tag
        except psutil.Error:
            return False

    assert not [q for q in psutil.process_iter() if mine(q)]
