"""Every launcher: probe activation (`-m ddp_doctor.probe` in front of the script) and `ddp-doctor attach`
under an srun-style start (one process per rank, environment set by hand), Lightning's own launcher,
Lightning under torchrun and `accelerate launch` — each a real hung 2-rank job, diagnosed at the right rank and line."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from launch_helpers import ROOT, Procs, rank_env, line_of, free_port

pytestmark = pytest.mark.scenario
HERE = Path(__file__).resolve().parent
RUN_BARRIER = ROOT / "tests" / "run" / "scripts" / "barrier_rank0.py"  # rank 0 barrier under `if rank == 0` (line 19)
ATTACH_BARRIER = ROOT / "tests" / "attach" / "scripts" / "barrier_rank0.py"
LIGHTNING = HERE / "scripts" / "lightning_barrier.py"
ACCELERATE = HERE / "scripts" / "accelerate_barrier.py"


def _srun_style(procs: Procs, script: Path, args: list[str], **extra) -> list[subprocess.Popen]:
    port = free_port()
    return [procs.start([sys.executable, *args, str(script)], rank_env(
        RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **extra),
        cwd=script.parent) for r in (0, 1)]


def _attach(tmp_path: Path, *pids: int) -> dict:
    out = tmp_path / "attach.json"
    deadline = time.monotonic() + 60
    while True:
        p = subprocess.run([sys.executable, "-m", "ddp_doctor", "attach", *map(str, pids), "--report", str(out),
                            "--samples", "3", "--interval", "0.5"], env=rank_env(), capture_output=True, text=True,
                           timeout=120)
        assert p.returncode in (0, 1), p.stderr
        rep = json.loads(out.read_text())
        if rep["verdict"] != "ok" or time.monotonic() > deadline:
            return rep
        time.sleep(0.5)


def _probe_report(report: Path) -> dict:
    assert report.exists()
    return json.loads(report.read_text())


def _ddp201(rep: dict, script: Path, marker: str) -> None:
    f = next(f for f in rep["findings"] if f["severity"] == "error")
    assert (f["code"], f["ranks"]) == ("DDP201", [0]), rep["findings"]
    assert f["location"]["path"].endswith(script.name) and f["location"]["line"] == line_of(script, marker)


def test_srun_style_probe_activation(procs, tmp_path):
    report = tmp_path / "r.json"
    ps = _srun_style(procs, RUN_BARRIER, ["-m", "ddp_doctor.probe"], DDP_DOCTOR_REPORT=str(report))
    codes = procs.wait_all()
    assert all(c != 0 for c in codes), procs.text()[-3000:]  # the probes ended the hung ranks
    _ddp201(_probe_report(report), RUN_BARRIER, "expect: DDP201")
    assert ps


def test_srun_style_attach_then_stop_ends_only_the_ranks(procs, tmp_path):
    """One hung srun-style job: attach diagnoses it and leaves it running; then, with no elastic agent,
    --stop signals the ranks themselves, never their parent (srun, a shell, this test)."""
    ps = _srun_style(procs, ATTACH_BARRIER, [])
    procs.wait_for("at step 5", 2)
    rep = _attach(tmp_path, *(p.pid for p in ps))
    _ddp201(rep, ATTACH_BARRIER, "if step == 5 and rank == 0")
    assert rep["agent_pid"] is None and rep["partial"] is False  # no launcher: --stop would signal the ranks only
    assert all(p.poll() is None for p in ps)
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "attach", *(str(x.pid) for x in ps), "--stop",
                        "--samples", "2", "--interval", "0.5"], env=rank_env(), capture_output=True, text=True, timeout=120)
    assert p.returncode in (0, 1), p.stderr
    assert "stopped:" in p.stdout
    for x in ps:
        x.wait(timeout=30)
    assert all(x.returncode != 0 for x in ps)


def test_lightning_own_launcher_attach(procs, tmp_path):
    p = procs.start([sys.executable, str(LIGHTNING)], rank_env(), cwd=LIGHTNING.parent)
    procs.wait_for("at batch 5", 2)
    rep = _attach(tmp_path, p.pid)
    _ddp201(rep, LIGHTNING, "expect: DDP201")
    assert sorted(r["rank"] for r in rep["ranks"]) == [0, 1]
    assert next(r for r in rep["ranks"] if r["rank"] == 0)["pid"] == p.pid  # the started process is rank 0
    assert p.poll() is None


def test_lightning_under_torchrun_probe(procs, tmp_path):
    """Lightning detects torchrun's environment and does not spawn: every rank runs the probe.  The embedded
    watcher's diagnosis names the barrier line (as DDP203 ranks 0, 1: it pairs rank 0's barrier with rank 1's
    Lightning broadcast); Lightning's own signal handling keeps the ranks alive after the probe's stop."""
    report = tmp_path / "r.json"
    procs.start([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-endpoint",
                 f"127.0.0.1:{free_port()}", "-m", "ddp_doctor.probe", str(LIGHTNING)],
                rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=LIGHTNING.parent)
    deadline = time.monotonic() + 150
    while not report.exists():  # (written atomically: once it exists, it is whole)
        assert time.monotonic() < deadline, procs.text()[-3000:]
        time.sleep(0.2)
    rep = _probe_report(report)
    f = next(f for f in rep["findings"] if f["severity"] == "error")
    assert f["code"] in ("DDP201", "DDP203") and 0 in f["ranks"], rep["findings"]
    assert f["location"]["line"] == line_of(LIGHTNING, "expect: DDP201")


def _accelerate(procs: Procs, extra: list[str], **env) -> subprocess.Popen:
    return procs.start([sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                        "--main_process_port", str(free_port()), *extra, str(ACCELERATE)], rank_env(**env),
                       cwd=ACCELERATE.parent)


def test_accelerate_launch_probe(procs, tmp_path):
    report = tmp_path / "r.json"
    _accelerate(procs, ["-m", "ddp_doctor.probe"], DDP_DOCTOR_REPORT=str(report))
    assert procs.wait_all(timeout=180) != [0], procs.text()[-3000:]
    _ddp201(_probe_report(report), ACCELERATE, "expect: DDP201")


def test_accelerate_launch_attach(procs, tmp_path):
    p = _accelerate(procs, [])
    procs.wait_for("at step 5", 2)
    rep = _attach(tmp_path, p.pid)
    _ddp201(rep, ACCELERATE, "expect: DDP201")
    assert p.poll() is None


def test_accelerate_script_under_ddp_doctor_run(procs, tmp_path):
    """An accelerate script needs no `accelerate launch` to be watched: Accelerator reads torchrun's variables."""
    report = tmp_path / "r.json"
    procs.start([sys.executable, "-m", "ddp_doctor", "run", "--report", str(report), "--nproc-per-node", "2",
                 "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(ACCELERATE)], rank_env(), cwd=ACCELERATE.parent)
    assert procs.wait_all(timeout=180) == [1], procs.text()[-3000:]
    _ddp201(_probe_report(report), ACCELERATE, "expect: DDP201")
