"""diagnose_perf on synthetic evidence: each diagnosis fires on its pattern and stays quiet on the clean twin."""
import pytest

from ddp_doctor.diagnose.perf import diagnose_perf, rank_split, recommend_workers, step_phases

from perf_evidence import evidence, rank_state


def codes(ev):
    return [f.code for f in diagnose_perf(ev)]


def test_clean_balanced_job_has_no_finding():
    ev = evidence(rank_state(0, data=0.001, compute=0.03), rank_state(1, data=0.001, compute=0.03))
    assert codes(ev) == []


@pytest.mark.parametrize("timeline", [True, False])
def test_data_bound(timeline):
    ev = evidence(rank_state(0, data=0.06, compute=0.02, timeline=timeline),
                  rank_state(1, data=0.05, compute=0.02, timeline=timeline), cpu_count=8)
    [f] = diagnose_perf(ev)
    assert f.code == "DDP401" and f.severity.value == "warning" and f.ranks == [0, 1]
    assert f.location.path == "/job/train.py" and f.location.line == 12
    assert "num_workers=0" in f.said and "batch_size=32" in f.said
    assert "num_workers=3" in f.fix  # 8 CPUs / 2 ranks per node = 4, one kept for the training process
    assert f.evidence["share"][0] == pytest.approx(0.06 / 0.085, abs=0.01)
    assert f.evidence["recommended_num_workers"] == 3


def test_data_bound_needs_absolute_wait():
    # 50% share but 1 ms per step: not worth a warning
    ev = evidence(rank_state(0, data=0.001, compute=0.001, coll=0.0), rank_state(1, data=0.001, compute=0.001, coll=0))
    assert "DDP401" not in codes(ev)


def test_data_bound_cpu_saturated_says_so():
    ev = evidence(rank_state(0, data=0.06, num_workers=8), rank_state(1, data=0.06, num_workers=8), cpu_count=4)
    [f] = [f for f in diagnose_perf(ev) if f.code == "DDP401"]
    assert "CPU-bound" in f.fix


def test_data_bound_mentions_oversubscribed_node():
    a = rank_state(0, data=0.06, num_workers=2)
    a["loadavg"] = [12.0, 9.0, 5.0]
    [f] = [f for f in diagnose_perf(evidence(a, rank_state(1, data=0.06, num_workers=2), cpu_count=2))
           if f.code == "DDP401"]
    assert "oversubscribed" in f.said and f.evidence["overloaded_load"] == 12.0


def test_recommend_workers():
    assert recommend_workers(2, 2) == 1
    assert recommend_workers(64, 8) == 7
    assert recommend_workers(128, 1) == 8


def test_step_phases_split():
    st = rank_state(0, steps=10, data=0.01, compute=0.02, coll=0.005)
    ph = step_phases(st)
    assert len(ph) == 10
    assert ph[3]["data"] == pytest.approx(0.01) and ph[3]["collective"] == pytest.approx(0.005)
    assert ph[3]["compute"] == pytest.approx(0.02)
    sp = rank_split(st)
    assert sp["source"] == "timeline" and sp["data_s"] == pytest.approx(0.01)


def test_straggler_compute():
    # rank 1 computes 60 ms, rank 0 20 ms; rank 0 waits in the all-reduce
    ev = evidence(rank_state(0, data=0.002, compute=0.02, coll=0.042),
                  rank_state(1, data=0.002, compute=0.06, coll=0.002))
    fs = [f for f in diagnose_perf(ev) if f.code == "DDP404"]
    assert len(fs) == 1
    f = fs[0]
    assert f.ranks == [1] and f.evidence["phase"] == "compute"
    assert "rank 1" in f.said and "compute" in f.said and "+40 ms" in f.said
    assert f.evidence["consistency"] == 1.0


def test_straggler_data():
    ev = evidence(rank_state(0, data=0.002, compute=0.02, coll=0.03),
                  rank_state(1, data=0.032, compute=0.02, coll=0.001, site_line=40))
    f = [f for f in diagnose_perf(ev) if f.code == "DDP404"][0]
    assert f.ranks == [1] and f.evidence["phase"] == "data" and f.location.line == 40


def test_one_slow_step_is_not_a_straggler():
    a = rank_state(0, data=0.002, compute=0.02, coll=0.002)
    b = rank_state(1, data=0.002, compute=0.02, coll=0.002)
    b["timeline"][-1]["dur"] += 2.0  # one hiccup of 2 s on rank 1
    b["timeline"][-3]["dur"] += 2.0
    assert "DDP404" not in codes(evidence(a, b))


def test_balanced_ranks_no_straggler():
    ev = evidence(*(rank_state(r, data=0.002, compute=0.02 + 0.001 * r, coll=0.003) for r in range(4)))
    assert "DDP404" not in codes(ev)


def test_worker_restarts():
    ev = evidence(rank_state(0, num_workers=4, epochs=5, data=0.001, epoch_start=[0.9, 0.8, 0.85, 0.8, 0.82]),
                  rank_state(1, num_workers=4, epochs=5, data=0.001, epoch_start=[0.9, 0.8, 0.85, 0.8, 0.82]))
    [f] = [f for f in diagnose_perf(ev) if f.code == "DDP403"]
    assert f.ranks == [0, 1] and f.location.line == 12 and f.severity.value == "info"
    assert "persistent_workers=True" in f.fix and f.evidence["epochs"] == 5


@pytest.mark.parametrize("kw", [dict(persistent=True), dict(num_workers=0), dict(epochs=1)])
def test_worker_restarts_clean_twins(kw):
    base = dict(num_workers=4, epochs=5, data=0.001, epoch_start=[0.9] * 5)
    base.update(kw)
    if base["epochs"] == 1:
        base["epoch_start"] = [0.9]
    ev = evidence(rank_state(0, **base), rank_state(1, **base))
    assert "DDP403" not in codes(ev)


def _ddp(unused_seen, fup=True):
    return [{"site": {"path": "/job/train.py", "line": 30, "function": "main"}, "find_unused_parameters": fup,
             "broadcast_buffers": True, "buffers": 0, "params": 4, "unused_seen": unused_seen}]


def test_find_unused_never_seen():
    ev = evidence(rank_state(0, ddp=_ddp(False)), rank_state(1, ddp=_ddp(False)))
    [f] = [f for f in diagnose_perf(ev) if f.code == "DDP405"]
    assert f.location.line == 30 and "find_unused_parameters=False" in f.fix


@pytest.mark.parametrize("ranks_seen", [(False, True), (None, None), ("nofup", "nofup")])
def test_find_unused_clean(ranks_seen):
    states = [rank_state(r, ddp=_ddp(False, fup=False) if s == "nofup" else _ddp(s)) for r, s in enumerate(ranks_seen)]
    assert "DDP405" not in codes(evidence(*states))


def test_too_few_steps_no_judgement():
    ev = evidence(rank_state(0, steps=3, data=0.1), rank_state(1, steps=3, data=0.1))
    assert codes(ev) == []


def test_epoch_start_waits_are_ddp403_not_ddp401():
    # steady batches are fast (1 ms), but every epoch's first batch waits 400 ms for new workers
    states = []
    for r in range(2):
        st = rank_state(r, steps=32, epochs=4, data=0.001, compute=0.01, num_workers=2,
                        epoch_start=[0.4, 0.4, 0.4, 0.4])
        tl = st["timeline"]
        steps = [e for e in tl if e["kind"] == "step"]
        for k in (8, 16, 24):  # epoch starts inside these steps: their data wait includes the worker start-up
            s = steps[k]
            tl.append({"t": s["t"], "kind": "epoch", "dur": 0, "label": "loader 0 epoch"})
            s["dur"] += 0.4
            dw = [e for e in tl if e["kind"] == "data_wait" and e["t"] == s["t"]][0]
            dw["dur"] += 0.4
        states.append(st)
    found = codes(evidence(*states))
    assert "DDP403" in found and "DDP401" not in found


@pytest.mark.parametrize("state", [
    {},
    {"rank": 0, "missing": True},
    {"rank": 0, "timeline": None, "loaders": None, "ddp": None, "timing": None, "step_times": None},
    {"rank": 0, "timing": {"steps": 10, "step_time_s": 0.0}, "loaders": [{"site": None, "epoch_start_s": [1, 2]}]},
    {"rank": 0, "timeline": [{"t": 0, "kind": "step", "dur": 0.1}], "loaders": [{}], "ddp": [{}]},
])
def test_partial_evidence_never_raises(state):
    assert diagnose_perf(evidence(dict(state, rank=0), dict(state, rank=1))) == []


def test_all_ranks_data_bound_is_not_a_straggler():
    ev = evidence(rank_state(0, data=0.02, compute=0.01, coll=0.015), rank_state(1, data=0.035, compute=0.01, coll=0.0))
    found = codes(ev)
    assert "DDP401" in found and "DDP404" not in found
