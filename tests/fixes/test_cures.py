"""agree / skip_if_nonfinite / EarlyStopping / gather_variable / rank_zero_first / load_checkpoint on 2 gloo ranks."""
import math

import pytest
import torch

from ddp_doctor import fixes

pytestmark = pytest.mark.timeout(90)


def test_nan_skip_desyncs_without_fix(ranks):
    run = ranks("cures.py", "nan", timeout=60)
    assert run.code != 0


def test_skip_if_nonfinite_keeps_ranks_in_step(ranks):
    run = ranks("cures.py", "nan", "--fix", timeout=60)
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert res[0] == res[1] == {"steps": 5, "skipped": 1, "total": 10.0}


def test_agree(ranks):
    run = ranks("cures.py", "agree", timeout=60)
    assert run.code == 0, run.stderr
    res = run.results()
    assert res[0] == res[1] == {"any": True, "all": False, "all_true": True, "tensor_any": True}


def test_early_stopping_stops_all_ranks_together(ranks):
    run = ranks("cures.py", "early", timeout=60)
    assert run.code == 0, run.stderr
    res = run.results()
    assert res[0] == res[1]
    assert res[0]["stopped_at"] == 3  # rank 0's metric stalled for `patience` epochs; rank 1 stops with it
    assert res[0]["mean_stops"] == [False, False, True, True] and res[0]["best"] == 1.5


def test_gather_variable(ranks):
    run = ranks("cures.py", "gather", timeout=60)
    assert run.code == 0, run.stderr
    res = run.results()
    assert res[0] == res[1]
    assert res[0]["shapes"] == [[3, 2], [5, 2]] and res[0]["cat"] == 8
    assert res[0]["sum"] == sum(range(6)) + sum(range(10))
    assert res[0]["ragged"] == [[2, 1], [3, 2]] and res[0]["ragged_sum"] == 2 + 6
    assert "disagree" in res[0]["mismatch"]  # a clear error on every rank, not a gloo abort


@pytest.mark.parametrize("case,expect0,expect1", [
    ("rzf_ok", "ok", "ok"),
    ("rzf_fail", "OSError: download failed", "RankZeroFailed"),
    ("rzf_fail_other", "RankZeroFailed", "OSError: disk full"),
])
def test_rank_zero_first(ranks, tmp_path, case, expect0, expect1):
    run = ranks("cures.py", case, "--tmp", str(tmp_path), timeout=60)
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert res[0]["outcome"].startswith(expect0) and res[1]["outcome"].startswith(expect1)
    if case == "rzf_ok":
        assert res[1]["saw_marker"] == [True]  # rank 1 ran its body after rank 0's


def test_naive_barrier_hangs_until_timeout(ranks):
    # the pattern rank_zero_first replaces: rank 1 only gets out through the process-group timeout
    run = ranks("cures.py", "rzf_naive", timeout=60)
    assert run.results()[1]["outcome"] == "RuntimeError"


def test_load_checkpoint_multirank(ranks, tmp_path):
    run = ranks("cures.py", "ckpt", "--tmp", str(tmp_path), timeout=60)
    assert run.code == 0, run.stderr
    res = run.results()
    assert res[0]["keys"] == ["bias", "weight"]  # 'module.' stripped
    assert res[1]["device"] == "cpu" and res[1]["epoch"] == 3


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
