"""A multi-node follower whose side channel is unreachable keeps training; the report names the unwatched node."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import uuid

import pytest

from conftest import SCRIPTS, Blackhole, env

pytestmark = pytest.mark.scenario  # real multi-rank jobs: the full tier (make test), not test-fast


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_follower_with_unreachable_side_channel_keeps_training(tmp_path):
    port, hole, rdzv = _free_port(), Blackhole(), str(uuid.uuid4())[:8]
    procs = []
    try:
        for k in range(2):
            cmd = [sys.executable, "-m", "ddp_doctor", "run", "--quiet", "--no-lint", "--report", str(tmp_path / f"node{k}.json"),
                   *(["--watch-port", str(hole.port)] if k == 1 else []),
                   "--nnodes", "2", "--node-rank", str(k), "--nproc-per-node", "1", "--rdzv-backend", "c10d",
                   "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", rdzv, str(SCRIPTS / "short_train.py")]
            procs.append(subprocess.Popen(cmd, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                          start_new_session=True))
        outs = []
        for p in procs:
            try:
                outs.append(p.communicate(timeout=120)[0])
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                outs.append(p.communicate()[0])
    finally:
        hole.close()
    for p, out in zip(procs, outs):
        assert out.count("TRAINING DONE") == 1, out[-3000:]
        assert p.returncode == 0, out[-3000:]
    host, follower = (json.loads((tmp_path / f"node{k}.json").read_text()) for k in range(2))
    assert host["verdict"] == "ok" and follower["verdict"] == "ok"
    # the rendezvous numbers the nodes (c10d ignores --node-rank): the follower's rank is 0 or 1
    side = host["side_channel"]
    assert len(side["unwatched_ranks"]) == 1 and side["unwatched_ranks"][0] in (0, 1), side
    r = side["unwatched_ranks"][0]
    assert side["unwatched_nodes"] == [f"node {r} (ranks {r})"], side
    assert follower["side_channel"]["lost"] is True, follower["side_channel"]
    assert follower["side_channel"]["unwatched_nodes"] == ["node-rank 1 (this node)"], follower["side_channel"]
