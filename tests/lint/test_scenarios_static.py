"""The linter over the real training scripts of tests/scenarios (when present): the pitfalls it can see
statically are reported, and the clean twins get no hang/desync finding (DDP101/201/202)."""
import json
from pathlib import Path

import pytest

from ddp_doctor.lint import lint_paths

from .conftest import expected_all

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
MANIFEST = SCENARIOS / "scenarios.json"
# markers the linter can check on the same line
SAME_LINE = {"DDP101", "DDP102", "DDP103", "DDP201", "DDP401", "DDP403", "DDP405"}
# the runtime marks the collective / forward inside a helper, lint reports the guarded call of the helper;
# DDP102 is marked on both the DistributedSampler and the DataLoader line (either is right)
ANY_LINE = {"DDP201", "DDP202", "DDP102"}
# pitfalls that only show at run time (num_workers=1 is a setting lint rightly accepts; the wait is measured;
# lint's DDP201 looks at conditions on the rank, not on a rank's data (`if bad:` of a batch), and accepts a
# collective on an explicit subgroup under a rank condition (it cannot tell the group's members); a shard-local
# metric or an empty shard deciding over a collective is data, not the rank
RUNTIME_ONLY: set[str] = {"data_bound_few_workers.py", "bad_batch_gather_object.py", "node_leader_allreduce.py",
                          "best_metric_broadcast.py", "empty_shard_gather.py", "token_budget_no_sync.py",
                          "fsdp2_mesh_tp_rank_local.py", "twin_groups_thread_uneven.py",
                          # collectives torch issues inside an API lint does not know yet (apis.TABLE is run's)
                          "zero_consolidate_rank0.py", "fsdp2_score_uneven.py",
                          "dtensor_full_rank0.py", "pipeline_steps_uneven.py", "fsdp2_clip_rank0.py",
                          "fsdp2_state_dict_rank0.py",
                          # the runtime blames the `continue`/`return` from what the probe counted; lint sees
                          # DDP101 there (not the DDP201 where it showed) or nothing (a method's NaN return)
                          "step_none_continue.py", "step_method_nan_return.py",
                          # lint does not judge collectives inside DDP's Join (ranks legitimately differ there)
                          "join_logged_allreduce.py"}
HANG_CODES = {"DDP101", "DDP201", "DDP202"}
# a collective only some ranks reach, or the model's forward only some ranks run: the runtime confirms one by
# the other (diagnose.common.same_hazard); an FSDP forward is DDP201 at run time (a collective API) and DDP202
# to lint (the sharded model called under a rank condition)
SAME_HAZARD = {"DDP201": {"DDP201", "DDP202"}, "DDP202": {"DDP201", "DDP202"}}

pytestmark = pytest.mark.skipif(not MANIFEST.exists(), reason="tests/scenarios not in this checkout")


def _scenarios():
    if not MANIFEST.exists():
        return []
    try:
        items = json.loads(MANIFEST.read_text())["scenarios"]
        return [s for s in items if isinstance(s.get("expect"), dict) and "findings" in s["expect"]]
    except (ValueError, KeyError, TypeError, AttributeError):
        return []  # a manifest format this test does not know: nothing to check


def _name(s):
    return s.get("script") or s.get("name")


@pytest.mark.parametrize("scenario", _scenarios(), ids=_name)
def test_scenario_script(scenario):
    path = SCENARIOS / _name(scenario)
    if not path.exists():
        pytest.skip(f"{path.name} missing")
    res = lint_paths([path])
    assert res.errors == []
    got = {(f.code, f.location.line) for f in res.findings}
    codes = {c for c, _ in got}
    # a finding at a helper's call whose cause lies in the helper (an early `return`) names it as related
    got |= {(f.code, r["line"]) for f in res.findings for r in f.evidence.get("related") or ()}
    if path.name not in RUNTIME_ONLY:
        for code, line in expected_all(path):
            family = SAME_HAZARD.get(code, {code})
            if code in SAME_LINE and not (code in ANY_LINE and family & codes):
                assert (code, line) in got, f"{code} not reported on line {line}"
            elif code in ANY_LINE:
                assert family & codes, f"{code} not reported"
    if not scenario["expect"]["findings"]:
        assert not codes & HANG_CODES, f"clean twin flagged: {sorted(got)}"
