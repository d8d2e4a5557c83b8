"""Capture the evidence of real ``ddp-doctor run`` jobs for the golden tests (run by hand, not by pytest).

    PYTHONPATH=src python tests/golden/capture.py [NAME...]

Each scenario of tests/scenarios runs under ``ddp-doctor run`` with ``DDP_DOCTOR_EVIDENCE_OUT``; what the
diagnosis saw (evidence, live verdict, exit statuses) is saved as captures/NAME.json, with this checkout's
path replaced by ``/checkout`` (the golden test puts its own back) so the files do not depend on where they were made.  Then
``pytest tests/golden --update-golden`` rewrites the expected texts, to be reviewed like code.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
import manifest  # noqa: E402

# one real job per runtime code (and case) of the catalogue
SCENARIOS = ["uneven_filter_continue", "seed_001_no_set_epoch", "rank0_barrier", "seed_000_val_rank0_bn",
             "allgather_shape_mismatch", "op_mismatch", "rank_raises", "rank_sigkill", "rank_exits_early",
             "loader_stall", "seed_004_data_bound", "workers_restart", "straggler", "find_unused_all_used",
             "balanced", "allreduce_dtype_mismatch", "unused_params_branch", "worker_killed", "own_group_per_process",
             "accelerate_cpu_alone",
             # issue 12: the line that diverged (a library's collective on the common path, subgroups, new_group)
             "bad_batch_gather_object", "lightning_rank_zero_barrier", "node_leader_allreduce", "new_group_rank_args",
             # issue 12: the verdict policy (a stuck rank blamed at its line, slow-not-stuck info, skipped syncs)
             "stuck_read_rank1", "idle_wait_rank1", "nanogpt_nan_skip", "early_return_step",
             # issue 23: collectives torch issues inside the API the user called, sizes that explain
             "dcp_save_rank0", "zero_consolidate_rank0", "fsdp2_eval_rank0", "fsdp2_score_uneven",
             "moe_splits_unexchanged", "objects_list_lengths", "dtensor_full_rank0", "pipeline_steps_uneven"]
OUT = Path(__file__).with_name("captures")


def capture(name: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "capture.json"
        env = manifest.scenario_env(name, dict(os.environ, PYTHONPATH=str(ROOT / "src"), OMP_NUM_THREADS="1",
                                               DDP_DOCTOR_EVIDENCE_OUT=str(path)))
        cmd = [sys.executable, "-m", "ddp_doctor", "run", "--quiet", *manifest.doctor_options(name),
               *manifest.torchrun_argv(name)]
        subprocess.run(cmd, env=env, timeout=300, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        text = path.read_text(encoding="utf-8").replace(str(ROOT), "/checkout")
    OUT.mkdir(exist_ok=True)
    (OUT / f"{name}.json").write_text(json.dumps(json.loads(text), sort_keys=True) + "\n", encoding="utf-8")
    print("captured", name, flush=True)


if __name__ == "__main__":
    for n in sys.argv[1:] or SCENARIOS:
        try:
            capture(n)
        except Exception as e:  # keep going: one failed job must not lose the others
            print("FAILED", n, repr(e), flush=True)
