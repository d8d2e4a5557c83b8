"""The probe on a real GPU: NCCL with world size 1, and 2 ranks sharing the one GPU over gloo with CUDA tensors.

NCCL refuses two ranks on one GPU, so the multi-rank paths with CUDA tensors are run on gloo, which copies
them through the host.  Skipped visibly without a CUDA device (benchmarks/gpu_check.sh runs them on one);
``GPU_TEST_CPU=1`` in the scripts runs the same jobs on the CPU, which is how the expectations below were
checked on a machine without a GPU."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = Path(__file__).parent / "gpu_scripts"

pytestmark = [pytest.mark.gpu, pytest.mark.scenario, pytest.mark.timeout(300),
              pytest.mark.skipif(not torch.cuda.is_available(),
                                 reason="no CUDA device: the real-GPU probe tests need one")]


def _run(tmp_path, script: str, nproc: int, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--no-lint", "--report", str(report),
                        "--nproc-per-node", str(nproc), str(SCRIPTS / script), *args],
                       env=env, capture_output=True, text=True, timeout=240)
    assert report.exists(), p.stdout[-3000:] + p.stderr[-3000:]
    return p, json.loads(report.read_text())


def _line(script: str, marker: str) -> int:
    return next(i for i, ln in enumerate((SCRIPTS / script).read_text().splitlines(), 1) if marker in ln)


def test_nccl_world_size_one(tmp_path):
    """A synchronous all_reduce on NCCL returns before it completes: after a CUDA sync the probe shows it
    completed, as the last collective at its line; DDP's gradient syncs were counted as steps; verdict ok."""
    view = tmp_path / "view.json"
    p, rep = _run(tmp_path, "nccl_one_rank.py", 1, str(view))
    assert p.returncode == 0 and rep["verdict"] == "ok", p.stderr[-3000:]
    v = json.loads(view.read_text())
    assert v["backend"] == "nccl" and v["sum"] == [2.0] * 4
    assert v["after_sync"] is None
    assert v["last"]["op"] == "all_reduce"
    assert v["last"]["site"]["line"] == _line("nccl_one_rank.py", "synchronous call")
    r0 = rep["ranks"][0]
    assert r0["state"] == "finished" and r0["step"] == 30
    assert [f["code"] for f in rep["findings"] if f["severity"] == "error"] == []


def test_two_ranks_share_one_gpu_over_gloo(tmp_path):
    """Clean: both ranks on cuda:0; no false DDP301/DDP302 (the GPU that both use is each rank's own)."""
    p, rep = _run(tmp_path, "shared_gpu_gloo.py", 2)
    assert p.returncode == 0 and rep["verdict"] == "ok", p.stderr[-3000:]
    assert [r["step"] for r in rep["ranks"]] == [40, 40]
    assert [f["code"] for f in rep["findings"] if f["code"].startswith("DDP3") or f["severity"] == "error"] == []


def test_rank_conditional_cuda_all_reduce_on_shared_gpu(tmp_path):
    """Rank 0 alone calls an all_reduce of a CUDA tensor: DDP201 on rank 0 at that line, whatever gloo then
    does with the mismatched calls (on the CPU it crashes; it may also hang)."""
    p, rep = _run(tmp_path, "shared_gpu_gloo.py", 2, "--rank0-extra")
    assert p.returncode != 0 and rep["verdict"] in ("hang", "desync", "crash"), p.stderr[-3000:]
    found = [f for f in rep["findings"] if f["code"] == "DDP201"]
    assert found and found[0]["ranks"] == [0], rep["findings"]
    assert found[0]["location"]["line"] == _line("shared_gpu_gloo.py", "expect: DDP201")
