"""EvenBatches on real 2-rank gloo jobs: the uneven job fails, the same job wrapped finishes in step.

The passing cases share one 2-rank job (CPU is scarce); the failing one runs alone.
"""
import pytest
import torch

from ddp_doctor.fixes import EvenBatches

from multirank import run_ranks

pytestmark = pytest.mark.timeout(300)
CASES = ["filter:min", "filter:max", "iterable:min", "shards:min", "shards:max"]


@pytest.fixture(scope="module")
def job():
    run = run_ranks("even.py", *CASES, timeout=180)
    assert run.code == 0, run.stdout + run.stderr
    return run.results()


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_rank_local_filter_desyncs_without_fix():
    run = run_ranks("even.py", "filter:none", timeout=120)
    # rank 1 skips 3 batches per epoch: it leaves the loop early, rank 0 is left in a gradient all-reduce
    assert run.code != 0, run.stdout
    assert run.rank_codes[0] != 0


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
@pytest.mark.parametrize("mode,steps", [("min", 5), ("max", 8)])
def test_rank_local_filter_even_with_keep(job, mode, steps):
    r0, r1 = job[0][f"filter:{mode}"], job[1][f"filter:{mode}"]
    assert r0["steps"] == r1["steps"] == [steps, steps]
    assert r0["psum"] == r1["psum"]  # replicas still identical
    assert r0["sync"] == "step"  # a keep= filter makes the length unknown
    if mode == "max":
        assert r1["last"]["padded"] == 3


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_iterable_unknown_length(job):
    r0, r1 = job[0]["iterable:min"], job[1]["iterable:min"]
    assert r0["steps"] == r1["steps"] == [5, 5]
    assert r0["last"]["dropped_at_least"] == 1 and r0["sync"] == "step"


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
@pytest.mark.parametrize("mode,steps", [("min", 5), ("max", 8)])
def test_map_style_shards_agree_once_per_epoch(job, mode, steps):
    r0, r1 = job[0][f"shards:{mode}"], job[1][f"shards:{mode}"]
    assert r0["sync"] == "epoch"
    assert r0["steps"] == r1["steps"] == [steps, steps]
    assert r1["last"]["min"] == 5 and r1["last"]["max"] == 8


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
