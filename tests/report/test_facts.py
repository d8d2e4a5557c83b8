"""The fact check (report/facts.py): each kind of claim is caught when the report's own evidence contradicts
it, and passes when the evidence supports it -- and every golden capture's findings pass it."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from ddp_doctor.diagnose import diagnose
from ddp_doctor.evidence import Capture
from ddp_doctor.report.facts import contradictions
from ddp_doctor.session.assemble import state_entry as rank_entry

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
CASES = sorted((GOLDEN / "captures").glob("*.json")) + sorted((GOLDEN / "synthetic").glob("*.json"))


def _report(message: str, evidence: dict | None = None, ranks: list | None = None, code: str = "DDP101") -> dict:
    return {"findings": [{"code": code, "message": message, "evidence": evidence or {}}], "ranks": ranks or []}


def _loop_decision(cond: str, line: int = 10, kind: str = "for") -> dict:
    return {"decision": {"kind": kind, "condition": cond, "site": {"path": "/x/train.py", "line": line,
                                                                    "function": "main"}}}


def test_a_constant_range_never_ran_a_different_number_of_times():
    msg = "The ranks ran this loop a different number of times: what it iterates yields a different number"
    assert contradictions(_report(msg, _loop_decision("step in range(200)")))
    assert not contradictions(_report(msg, _loop_decision("step in range(n_steps)")))


def test_equal_loader_lengths_yield_the_same_number_of_items():
    msg = "what it iterates yields a different number of items per rank"
    assert contradictions(_report(msg, {**_loop_decision("(x, y) in loader"), "loader_len": {"0": 64, "1": 64}}))
    assert not contradictions(_report(msg, {**_loop_decision("(x, y) in loader"), "loader_len": {"0": 64, "1": 63}}))


def test_a_rank_above_the_loop_never_left_it():
    msg = "The ranks parted at `for (x, y) in loader:` (train.py:30): rank 0 left the loop; rank 1 stayed in the loop."
    above = [{"rank": 0, "stack": [{"path": "/x/train.py", "line": 19, "function": "main"}]}]
    below = [{"rank": 0, "stack": [{"path": "/x/train.py", "line": 41, "function": "main"}]}]
    assert contradictions(_report(msg, _loop_decision("(x, y) in loader", 30), above))
    assert not contradictions(_report(msg, _loop_decision("(x, y) in loader", 30), below))


def test_equal_step_counts_are_not_different_numbers_of_steps():
    assert contradictions(_report("In epoch 0 the ranks ran different numbers of optimizer steps (rank 0: 16, "
                                  "rank 1: 16): rank 1 left the epoch early"))
    assert not contradictions(_report("In epoch 0 the ranks ran different numbers of optimizer steps (rank 0: 16, "
                                      "rank 1: 15): rank 1 left the epoch early"))


def test_a_rank_with_no_optimizer_step_never_left_a_training_loop():
    msg = "Rank 1 left the training loop and finished after 0 steps while the others still train"
    assert contradictions(_report(msg, ranks=[{"rank": 1, "step": 0}]))
    assert not contradictions(_report(msg.replace("0 steps", "8 steps"), ranks=[{"rank": 1, "step": 8}]))


def test_a_forward_without_backward_needs_the_skipped_sync_count():
    msg = "rank 1 ran a DDP forward that prepared a gradient sync and then no backward, so ..."
    assert contradictions(_report(msg, {"skipped_syncs": {"0": 0, "1": 0}}))
    assert not contradictions(_report(msg, {"skipped_syncs": {"0": 0, "1": 1}}))


def test_a_micro_batch_split_needs_counts_that_differ():
    msg = "The pipeline stages split their batches into different numbers of micro-batches at the schedule's step"
    assert contradictions(_report(msg, {"microbatches": {"0": 4, "1": 4}}, code="DDP203"))
    assert not contradictions(_report(msg, {"microbatches": {"0": 4, "1": 2}}, code="DDP203"))


def test_lint_confirmation_needs_the_lint_finding():
    msg = "Rank 0 called barrier(). ddp-doctor lint flagged this line before the run (DDP201): the static warning came true."
    assert contradictions(_report(msg, {}, code="DDP201"))
    assert not contradictions(_report(msg, {"lint": {"code": "DDP201", "path": "t.py", "line": 3}}, code="DDP201"))


def test_an_unrecorded_value_is_never_printed_as_a_number():
    assert contradictions(_report("No rank progressed for Nones (hang limit Nones).", code="DDP205"))
    assert not contradictions(_report("No rank progressed for 91.2s (hang limit 90s).", code="DDP205"))


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_golden_finding_agrees_with_its_evidence(case):
    text = case.read_text(encoding="utf-8").replace('"/checkout/', f'"{GOLDEN.parents[1]}/')
    capture = Capture.from_json(json.loads(text))
    evidence, decision, failures = capture.args()
    _verdict, findings = diagnose(evidence, decision, failures)
    report = {"findings": [f.to_report_dict() for f in findings],
              "ranks": [rank_entry(r, st, failures or {}) for r, st in sorted(evidence.ranks.items())]}
    assert not contradictions(report), contradictions(report)
