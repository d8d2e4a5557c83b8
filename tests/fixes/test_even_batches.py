"""EvenBatches on real 2-rank gloo jobs: the uneven job fails, the same job wrapped finishes in step."""
import pytest
import torch

from ddp_doctor.fixes import EvenBatches

pytestmark = pytest.mark.timeout(90)


def test_rank_local_filter_desyncs_without_fix(ranks):
    run = ranks("even.py", "--data", "filter", "--fix", "none", timeout=60)
    # rank 1 skips 3 batches per epoch: it leaves the loop early, rank 0 is left in a gradient all-reduce
    assert run.code != 0, run.stdout
    assert run.rank_codes[0] != 0


@pytest.mark.parametrize("mode,steps", [("min", 5), ("max", 8)])
def test_rank_local_filter_even_with_keep(ranks, mode, steps):
    run = ranks("even.py", "--data", "filter", "--fix", mode, timeout=60)
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert res[0]["steps"] == res[1]["steps"] == [steps, steps]
    assert res[0]["psum"] == res[1]["psum"]  # replicas still identical
    assert res[0]["sync"] == "step"  # a keep= filter makes the length unknown
    if mode == "max":
        assert res[1]["last"]["padded"] == 3


def test_iterable_unknown_length(ranks):
    run = ranks("even.py", "--data", "iterable", "--fix", "min", timeout=60)
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert res[0]["steps"] == res[1]["steps"] == [5, 5]
    assert res[0]["last"]["dropped_at_least"] == 1


def test_iterable_without_fix_fails(ranks):
    run = ranks("even.py", "--data", "iterable", "--fix", "none", timeout=60)
    assert run.code != 0


@pytest.mark.parametrize("mode,steps", [("min", 5), ("max", 8)])
def test_map_style_shards_agree_once_per_epoch(ranks, mode, steps):
    run = ranks("even.py", "--data", "shards", "--fix", mode, timeout=60)
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert res[0]["sync"] == "epoch"
    assert res[0]["steps"] == res[1]["steps"] == [steps, steps]
    assert res[1]["last"]["min"] == 5 and res[1]["last"]["max"] == 8


def test_single_process_is_pass_through():
    ev = EvenBatches([1, None, 3], keep=lambda b: b is not None)
    assert list(ev) == [1, 3]
    assert ev.last_epoch["yielded"] == 2


def test_forwards_loader_attributes():
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=5)
    ev = EvenBatches(loader)
    assert ev.batch_size == 5 and ev.sync == "epoch"
    assert EvenBatches(loader, keep=bool).sync == "step"


def test_epoch_sync_refused_for_iterable():
    class S(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

        def __len__(self):
            return 3

    loader = torch.utils.data.DataLoader(S())
    assert EvenBatches(loader).sync == "step"  # __len__ of an IterableDataset is only a hint
    with pytest.raises(ValueError):
        EvenBatches(loader, sync="epoch")
    with pytest.raises(ValueError):
        EvenBatches([1], mode="median")
