"""Two `ddp-doctor run --nnodes 2` launchers on this machine form one job and give one diagnosis (global ranks)."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

pytestmark = pytest.mark.scenario
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


def _free_port_pair() -> int:
    for port in range(29600, 29990, 7):
        ok = True
        for p in (port, port + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", p))
                except OSError:
                    ok = False
        if ok:
            return port
    pytest.skip("no free port pair in 29600-29990")


def test_two_nodes_one_diagnosis(tmp_path):
    port = _free_port_pair()
    rdzv = str(uuid.uuid4())[:8]
    script = HERE / "scripts" / "barrier_rank0.py"
    env = dict(os.environ, PYTHONPATH=str(SRC))
    procs = []
    for k in range(2):
        cmd = [sys.executable, "-m", "ddp_doctor", "run", "--quiet", "--report", str(tmp_path / f"node{k}.json"),
               "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
               "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv, str(script)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True))
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=200)[0])
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            outs.append(p.communicate()[0])
    reports = [json.loads((tmp_path / f"node{k}.json").read_text()) for k in range(2)]
    for p, out in zip(procs, outs):
        assert p.returncode != 0, out[-2000:]
    r0, r1 = reports
    assert r0["world_size"] == 2 and r0["nnodes"] == "2"
    assert r0["verdict"] == r1["verdict"] == "hang", (r0["verdict"], r1["verdict"], outs[0][-1500:])
    for r in reports:
        f = next(f for f in r["findings"] if f["code"] == "DDP201")
        assert f["ranks"] == [0]  # global rank 0, whichever launcher it ran under
    assert r0["findings"] == r1["findings"]  # one diagnosis
    assert sorted(x["rank"] for x in r0["ranks"]) == [0, 1]
