"""Sizes that explain a mismatch (diagnose/sizes.py) and what the probe records for them (probe/describe.py)."""
from __future__ import annotations

import torch

from ddp_doctor.diagnose.sizes import explain, sizes_of
from ddp_doctor.evidence import Collective
from ddp_doctor.probe.describe import describe


def _a2a(shapes) -> Collective:
    return Collective("world", 0, "all_to_all_single", tuple(shapes), ("float32", "float32"))


def test_probe_records_split_sizes_and_list_lengths():
    out, inp = torch.empty(16, 8), torch.empty(16, 8)
    splits = {"output_split_sizes": [8, 8], "input_split_sizes": torch.tensor([10, 6])}
    shapes, dtypes = describe("all_to_all_single", (out, inp), splits)
    assert shapes == ("16x8", "16x8", "output_split_sizes=[8,8]", "input_split_sizes=[10,6]")
    assert dtypes == ("float32", "float32")
    # (src left to torch's default: global rank 0, recorded as the root every rank must name)
    assert describe("broadcast_object_list", ([1, 2, 3],), {})[0] == ("objects=3", "root=0")
    assert describe("all_reduce", (torch.empty(4),), {})[0] == ("4",)


def test_all_to_all_split_mismatch_says_who_sends_what_to_whom():
    r0 = _a2a(["16x8", "16x8", "output_split_sizes=[8,8]", "input_split_sizes=[8,8]"])
    r1 = _a2a(["20x8", "20x8", "output_split_sizes=[14,6]", "input_split_sizes=[14,6]"])
    s = explain({0: r0, 1: r1}, 2)
    assert "rank 0 sends 8 rows to rank 1, which expects 14 from it" in s.text
    assert "rank 1 sends 14 rows to rank 0, which expects 8 from it" in s.text
    assert "Exchange the counts first" in s.fix


def test_consistent_splits_and_even_splits_explain_nothing():
    r0 = _a2a(["18x8", "16x8", "output_split_sizes=[8,10]", "input_split_sizes=[8,8]"])
    r1 = _a2a(["14x8", "20x8", "output_split_sizes=[8,6]", "input_split_sizes=[10,6]"])
    assert explain({0: r0, 1: r1}, 2) is None
    assert explain({0: _a2a(["4x2", "4x2"]), 1: _a2a(["4x2", "4x2"])}, 2) is None
    assert sizes_of(r0) == {"output_split_sizes": (8, 10), "input_split_sizes": (8, 8)}


def test_object_lists_of_different_lengths_name_each_length_and_the_box():
    c = {r: Collective("world", 3, "broadcast_object_list", (f"objects={n}",)) for r, n in ((0, 3), (1, 2))}
    s = explain(c, 2)
    assert "rank 0: 3, rank 1: 2" in s.text and "box" in s.fix


def test_functional_collectives_are_recorded_in_c10d_layout(monkeypatch):
    from ddp_doctor.probe import funcol

    class PG:
        def size(self):
            return 2

    monkeypatch.setattr(funcol, "_process_group", lambda g, tag="": PG())
    gather = funcol._describer("all_gather_into_tensor", 2, "mul", lambda pg: "world")
    assert gather((torch.empty(4, 3), 0, "mesh"), {}) == ("world", ("8x3", "4x3"), ("float32", "float32"))
    a2a = funcol._describer("all_to_all_single", 3, None, lambda pg: "pg:0,1")
    key, shapes, _ = a2a((torch.empty(6, 2), [2, 4], [3, 3], "g"), {})
    assert key == "pg:0,1" and shapes == ("6x2", "output_split_sizes=[2,4]", "input_split_sizes=[3,3]")
    outside = funcol._describer("all_reduce", 2, None, lambda pg: None)
    assert outside((torch.empty(1), "sum", "g"), {})[0] is None


def test_a_gloo_abort_is_the_cause_and_the_reset_after_it_the_consequence():
    from ddp_doctor.diagnose.exits import diagnose_exit
    from ddp_doctor.evidence import ExitStatus, JobEvidence, RaisedError, RankState, Site, Verdict

    c10d = Site("/venv/site-packages/torch/distributed/distributed_c10d.py", 4380, "all_gather_single")
    aborted = RankState(rank=1, stack=(Site("/x/t.py", 48, "main"), c10d), exit=ExitStatus(-6, "SIGABRT"))
    # the peer's reset surfaced outside a recorded call (the wait of an async all-gather)
    reset = RaisedError("RuntimeError", "[pair.cc:537] Read error: Connection reset by peer",
                        location=Site("/x/t.py", 47, "main"))
    peer = RankState(rank=0, exc=reset, exit=ExitStatus(1))
    out = diagnose_exit(JobEvidence(world_size=2, ranks={0: peer, 1: aborted}), Verdict("exit"))
    assert [f.ranks for f in out] == [[1]]
    assert "aborted by gloo (SIGABRT) inside all_gather_single" in out[0].said
    assert "root cause" not in out[0].said
