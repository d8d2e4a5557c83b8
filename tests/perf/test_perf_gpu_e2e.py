"""DDP301 end to end on real GPUs (>= 2 CUDA devices with NVML); skipped visibly elsewhere."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ddp_doctor import gpu

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2 or gpu.snapshot() is None,
                    reason="needs >= 2 CUDA GPUs and NVML: the real DDP301 run is skipped on this machine")
@pytest.mark.gpu
@pytest.mark.scenario  # a real 2-rank job
@pytest.mark.timeout(300)
def test_checkpoint_on_gpu0_is_ddp301(tmp_path):
    report = tmp_path / "r.json"
    env = dict(os.environ, PYTHONPATH=str(SRC), CKPT=str(tmp_path / "ck.pt"))
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--no-lint", "--report", str(report),
                        "--nproc-per-node", "2", "--standalone", str(HERE / "gpu_scripts" / "load_on_gpu0.py")],
                       capture_output=True, text=True, timeout=280, env=env)
    rep = json.loads(report.read_text())
    assert rep["exit_code"] == 0, p.stderr[-3000:]
    found = [f for f in rep["findings"] if f["code"] == "DDP301" and f.get("source", "runtime") == "runtime"]
    assert found and found[0]["ranks"] == [1] and found[0]["location"]["line"] == 17
