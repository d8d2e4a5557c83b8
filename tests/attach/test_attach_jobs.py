"""`ddp-doctor attach` on real hung 2-rank jobs under plain torchrun: the right rank, code and line, and the job
left exactly as it was (attach never stops it without --stop).  A rank stalled in its own data code, a mismatched
collective and a rank-0 barrier before training are also looked at by tests/parity, beside run's and Flight
Recorder's view of the same job."""
from __future__ import annotations

import json
import time

import pytest

from conftest import SCRIPTS, SRC, free_port, run_attach

pytestmark = pytest.mark.scenario


def _line(script: str, marker: str) -> int:
    lines = (SCRIPTS / script).read_text().splitlines()
    return next(i for i, s in enumerate(lines, 1) if marker in s)


def _diagnose(job, tmp_path, *extra: str, settle_s: float = 60) -> dict:
    """Attach until the job is seen stuck (it may still be settling into its hang; ``settle_s`` 0: one look);
    returns the report."""
    deadline = time.monotonic() + settle_s
    report = tmp_path / "attach.json"
    while True:
        before = job.tree()
        p = run_attach(str(job.proc.pid), "--report", str(report), "--samples", "3", "--interval", "0.5", *extra)
        assert p.returncode in (0, 1), p.stderr + p.stdout
        rep = json.loads(report.read_text())
        if rep["verdict"] != "ok" or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    if "--stop" not in extra:
        assert job.proc.poll() is None, "attach must not end the job"
        after = job.tree()
        assert set(before) == set(after), (before, after)  # no process killed or lost
        assert all(s != "stopped" for s in after.values())  # and none left paused
    from ddp_doctor.cli.report import validate

    assert validate(rep) == []  # the report/v1 contract
    rep["_stdout"] = p.stdout
    return rep


def _only(rep: dict, code: str) -> dict:
    errors = [f for f in rep["findings"] if f["severity"] == "error"]
    assert [f["code"] for f in errors] == [code], json.dumps(rep["findings"], indent=1)[:3000]
    return errors[0]


def test_rank0_barrier_then_stop_only_when_asked(hung_job, tmp_path):
    """One hung job: attach diagnoses it and leaves it exactly as it was; attach --stop then ends it."""
    job = hung_job("barrier_rank0.py")
    job.wait_for("at step 5", 2)
    rep = _diagnose(job, tmp_path)
    assert rep["verdict"] == "hang" and rep["world_size"] == 2 and rep["partial"] is False
    f = _only(rep, "DDP201")
    assert f["ranks"] == [0]
    assert f["location"]["path"].endswith("barrier_rank0.py")
    assert f["location"]["line"] == _line("barrier_rank0.py", "if step == 5 and rank == 0")
    states = {r["rank"]: r for r in rep["ranks"]}
    assert states[1]["last_collective"]["op"] == "ddp.backward(allreduce_grads)"
    assert "DDP201" in rep["_stdout"] and "barrier_rank0.py:" in rep["_stdout"]
    # the same hung job, now with --stop: attach ends it only when asked
    rep = _diagnose(job, tmp_path, "--stop")
    assert rep["verdict"] == "hang"
    job.proc.wait(timeout=30)
    assert job.proc.returncode != 0


def test_loader_worker_stall(hung_job, tmp_path):
    job = hung_job("worker_stall.py")
    job.wait_for("done with shard 0", 2)
    rep = _diagnose(job, tmp_path)
    f = _only(rep, "DDP205")
    assert f["ranks"] == [0, 1]
    assert f["location"]["line"] == _line("worker_stall.py", "time.sleep(0.05)")
    assert "DataLoader worker" in f["message"]
    workers = [w for r in rep["ranks"] for w in r["workers"]]
    assert len(workers) == 4 and all(any(fr["path"].endswith("worker_stall.py") for fr in w["stack"])
                                     for w in workers)
    assert {r["state"] for r in rep["ranks"]} == {"data_wait"}


def test_mismatched_all_gather(hung_job, tmp_path):
    job = hung_job("allgather_mismatch.py")
    job.wait_for("epoch end", 2)
    rep = _diagnose(job, tmp_path, "--html", str(tmp_path / "a.html"))
    f = next(f for f in rep["findings"] if f["severity"] == "error")
    assert f["code"] in ("DDP201", "DDP203") and f["ranks"] == [0]
    assert f["location"]["line"] == _line("allgather_mismatch.py", "if rank == 0:")  # where the ranks parted
    assert "barrier" in f["message"]
    assert "DDP201" in (tmp_path / "a.html").read_text()


def test_no_training_process(tmp_path):
    import subprocess
    import sys

    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        p = run_attach(str(idle.pid))
    finally:
        idle.kill()
        idle.wait()
    assert p.returncode == 2
    assert "no training process found" in p.stderr and "Traceback" not in p.stderr


def test_two_nodes_partial_reports_merge(hung_job, tmp_path):
    """Two torchrun "nodes" (one rank each) form one job; each node's attach report is partial, the merge
    names rank 0's barrier."""

    port = free_port()
    nodes = [hung_job("barrier_rank0.py", 1, ["--nnodes", "2", "--node-rank", str(k), "--rdzv-backend", "c10d",
                                              "--rdzv-endpoint", f"127.0.0.1:{port}"]) for k in (0, 1)]
    for n in nodes:
        n.wait_for("at step 5", 1)
    paths = []
    for k, n in enumerate(nodes):
        rep = _diagnose(n, tmp_path)
        assert rep["partial"] is True and len(rep["ranks"]) == 1
        path = tmp_path / f"node{k}.json"
        path.write_text(json.dumps({k: v for k, v in rep.items() if k != "_stdout"}))
        paths.append(str(path))
    merged = tmp_path / "merged.json"
    import os
    import subprocess
    import sys


    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "report", *paths, "-o", str(merged), "--color", "never"],
                       env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rep = json.loads(merged.read_text())
    assert rep["partial"] is False and [r["rank"] for r in rep["ranks"]] == [0, 1]
    f = _only(rep, "DDP201")
    assert f["ranks"] == [0] and f["location"]["line"] == _line("barrier_rank0.py", "if step == 5 and rank == 0")
    assert "DDP201" in p.stdout


def test_healthy_job_is_not_a_hang(hung_job, tmp_path):
    """Never blame a healthy job: ranks that move or compute get verdict ok and no error finding."""
    job = hung_job("healthy.py")
    job.wait_for("training", 2)
    for _ in range(3):  # several independent looks: none may call it a hang
        rep = _diagnose(job, tmp_path, settle_s=0)
        assert rep["verdict"] == "ok", rep["findings"]
        assert not [f for f in rep["findings"] if f["severity"] == "error"]
