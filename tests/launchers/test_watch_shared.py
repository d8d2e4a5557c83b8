"""`ddp_doctor.watch()` at the top of the file under Lightning Fabric and under the HF Trainer started by
`accelerate launch`, the rows test_watch.py does not run: each launcher's three 2-rank CPU jobs (healthy,
a collective rank 0 alone reaches, a raise on rank 1) start at once from one module fixture and each test
reads one of them (their waits overlap: CI time).  The same checks as test_watch.py's (`expect`, `ended`):
a healthy run reported clean, ending 0 with nothing of c10d's, no traceback and nothing of ddp_doctor's in
any rank's output; the hung one stopped and named at its rank and line; the raise named."""
from __future__ import annotations

import sys

import pytest
from launch_helpers import HERE, accelerate_launch, ended, expect, free_port, rank_env, running

pytestmark = pytest.mark.scenario
FABRIC = HERE / "scripts" / "fabric_watch.py"
HF = HERE / "scripts" / "hf_trainer_watch.py"


@pytest.fixture(scope="module")
def fabric(tmp_path_factory):
    """`python fabric_watch.py MODE`: `fabric.launch()` starts rank 1 (Lightning's subprocess launch); the
    started process is no rank until then (armed)."""
    def start(procs, mode, report):
        procs.start([sys.executable, str(FABRIC), mode], rank_env(
            DDP_DOCTOR_REPORT=str(report), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())), cwd=report.parent)

    with running(tmp_path_factory.mktemp("fabric"), ["ok", "barrier", "raise"], start) as cases:
        yield cases


@pytest.fixture(scope="module")
def hf_accelerate(tmp_path_factory):
    """`accelerate launch hf_trainer_watch.py MODE OUT`: the ranks are torchrun's (accelerate's environment);
    rank 0's lone collective is the common HF hang, `evaluate()` on the main process only."""
    def start(procs, mode, report):
        procs.start(accelerate_launch(HF, mode, str(report.parent / "out")),
                    rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=report.parent)

    with running(tmp_path_factory.mktemp("hf"), ["ok", "eval_main_only", "raise"], start) as cases:
        yield cases


@pytest.mark.parametrize("mode", ["ok", "barrier", "raise"])
def test_fabric_watch(fabric, mode):
    expect(fabric[mode].report, FABRIC, mode, "lightning (subprocess)")
    ended(fabric[mode].procs, mode)


@pytest.mark.parametrize("mode", ["ok", "eval_main_only", "raise"])
def test_hf_trainer_under_accelerate_watch(hf_accelerate, mode):
    expect(hf_accelerate[mode].report, HF, "main_only" if mode == "eval_main_only" else mode,
           "accelerate launch (transformers Trainer)")
    ended(hf_accelerate[mode].procs, mode)
