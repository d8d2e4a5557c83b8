"""agree / skip_if_nonfinite / EarlyStopping / gather_variable / rank_zero_first / load_checkpoint on 2 gloo ranks.

The passing cases share one 2-rank job (CPU is scarce); each failing "without the cure" case runs alone.
"""
import math

import pytest
import torch

from ddp_doctor import fixes

from multirank import run_ranks

pytestmark = pytest.mark.timeout(300)
CASES = ["nan_fix", "agree", "early", "gather", "rzf_ok", "rzf_fail", "rzf_fail_other", "ckpt"]


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    run = run_ranks("cures.py", *CASES, "--tmp", str(tmp_path_factory.mktemp("cures")), timeout=180)
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert set(res[0]) == set(res[1]) == set(CASES)
    return res


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_nan_skip_desyncs_without_fix():
    run = run_ranks("cures.py", "nan", timeout=120)
    assert run.code != 0  # rank 1 skipped a backward: rank 0's next gradient all-reduce fails


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_skip_if_nonfinite_keeps_ranks_in_step(job):
    assert job[0]["nan_fix"] == job[1]["nan_fix"] == {"steps": 5, "skipped": 1, "total": 10.0}


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_agree(job):
    assert job[0]["agree"] == job[1]["agree"] == {"any": True, "all": False, "all_true": True, "tensor_any": True}


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_early_stopping_stops_all_ranks_together(job):
    e0, e1 = job[0]["early"], job[1]["early"]
    assert e0 == e1
    assert e0["stopped_at"] == 3  # rank 0's metric stalled for `patience` epochs; rank 1 stops with it
    assert e0["mean_stops"] == [False, False, True, True] and e0["best"] == 1.5


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_gather_variable(job):
    g = job[0]["gather"]
    assert g == job[1]["gather"]
    assert g["shapes"] == [[3, 2], [5, 2]] and g["cat"] == 8
    assert g["sum"] == sum(range(6)) + sum(range(10))
    assert g["ragged"] == [[2, 1], [3, 2]] and g["ragged_sum"] == 2 + 6
    assert "disagree" in g["mismatch"]  # a clear error on every rank, not a gloo abort


@pytest.mark.parametrize("case,expect0,expect1", [
    ("rzf_ok", "ok", "ok"),
    ("rzf_fail", "OSError: download failed", "RankZeroFailed"),
    ("rzf_fail_other", "RankZeroFailed", "OSError: disk full"),
])
@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_rank_zero_first(job, case, expect0, expect1):
    assert job[0][case]["outcome"].startswith(expect0) and job[1][case]["outcome"].startswith(expect1)
    if case == "rzf_ok":
        assert job[1][case]["saw_marker"] == [True]  # rank 1 ran its body after rank 0's


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_load_checkpoint_multirank(job):
    assert job[0]["ckpt"]["keys"] == ["bias", "weight"]  # 'module.' stripped
    assert job[1]["ckpt"]["device"] == "cpu" and job[1]["ckpt"]["epoch"] == 3


def test_single_process_behaviour():
    assert fixes.agree(1) is True and fixes.agree(0, "all") is False
    assert fixes.skip_if_nonfinite(torch.tensor([1.0, math.inf]))
    assert not fixes.skip_if_nonfinite(torch.tensor(2.0))
    with pytest.raises(ValueError):
        fixes.agree(True, "most")
    assert fixes.gather_variable(torch.ones(3), cat=True).shape == (3,)
    with fixes.rank_zero_first():
        pass
    stop = fixes.EarlyStopping(patience=2, mode="max")
    assert [stop.step(v) for v in (1.0, 2.0, 1.5, 1.9)] == [False, False, False, True]


class Custom:
    pass


def test_load_checkpoint_options(tmp_path):
    sd = {"module.weight": torch.ones(2), "module.bias": torch.zeros(2)}
    torch.save(sd, tmp_path / "a.pt")
    assert sorted(fixes.load_checkpoint(tmp_path / "a.pt")) == ["bias", "weight"]
    assert sorted(fixes.load_checkpoint(tmp_path / "a.pt", strip=None)) == ["module.bias", "module.weight"]
    mixed = {"module.weight": torch.ones(1), "head.bias": torch.ones(1)}
    assert fixes.strip_prefix(mixed) is mixed  # only stripped when every key has the prefix
    torch.save({"obj": Custom()}, tmp_path / "b.pt")
    with pytest.raises(Exception, match="weights_only=False"):
        fixes.load_checkpoint(tmp_path / "b.pt")
    assert isinstance(fixes.load_checkpoint(tmp_path / "b.pt", weights_only=False)["obj"], Custom)


def test_local_device(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert fixes.local_device() == (torch.device("cuda", 1 % torch.cuda.device_count())
                                    if torch.cuda.is_available() else torch.device("cpu"))
