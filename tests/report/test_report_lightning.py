"""`ddp-doctor run` on small Lightning (2.x) Trainer and Fabric jobs: no change to the script, DDP on 2 CPU ranks.

Skipped (visibly) when lightning is not installed (it is the optional `lightning` extra).
"""
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import lightning  # noqa: E402,F401 (a test dependency: missing, it must fail loudly)
try:
    import ddp_doctor.cli.run  # noqa: F401
except ImportError:  # pragma: no cover
    pytest.skip("ddp-doctor run is not in this build yet", allow_module_level=True)

REPO = Path(__file__).resolve().parents[2]
APP = Path(__file__).with_name("lightning_app.py")
FABRIC_APP = Path(__file__).with_name("fabric_app.py")


def ddp_doctor_run(tmp_path, *extra_env, app=APP, timeout=240):
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"), OMP_NUM_THREADS="1", **dict(extra_env))
    cmd = [sys.executable, "-m", "ddp_doctor", "run", "--report", str(report), "--nproc-per-node", "2",
           "--standalone", str(app)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True, cwd=tmp_path)
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"ddp-doctor run did not finish in {timeout} s:\n{out[-4000:]}")
    assert report.exists(), out[-4000:]
    return proc.returncode, json.loads(report.read_text()), out


@pytest.mark.scenario
def test_lightning_clean_run(tmp_path):
    rc, r, out = ddp_doctor_run(tmp_path)
    assert rc == 0 and r["verdict"] == "ok", out[-4000:]
    assert r["world_size"] == 2
    # the probe sees Lightning's own loop: 256 samples / 2 ranks / batch 32 = 4 steps x 2 epochs
    assert [rk["step"] for rk in r["ranks"]] == [8, 8]
    assert not [f for f in r["findings"] if f.get("source") != "lint" and f["severity"] == "error"]


@pytest.mark.scenario
def test_fabric_rank0_barrier_is_diagnosed(tmp_path):
    """Fabric: `fabric.barrier()` on rank 0 only is caught at the mismatched collective."""
    rc, r, out = ddp_doctor_run(tmp_path, ("LIT_BUG", "1"), app=FABRIC_APP)
    assert rc != 0 and r["verdict"] in ("hang", "desync"), out[-4000:]
    runtime = [f for f in r["findings"] if f.get("source") != "lint"]
    assert any(f["code"] in ("DDP201", "DDP203") and 0 in f["ranks"] for f in runtime), runtime
    # the probe counted Fabric's training steps on both ranks before the mismatch
    assert all((rk["step"] or 0) >= 4 for rk in r["ranks"]), r["ranks"]
