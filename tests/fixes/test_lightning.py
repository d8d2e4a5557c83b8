"""DDPDoctorCallback with the real Lightning package on 2 CPU ranks (skipped, visibly, without Lightning)."""
import pytest

import lightning  # noqa: E402,F401 (a test dependency: missing, it must fail loudly)
from multirank import run_ranks  # noqa: E402

pytestmark = pytest.mark.timeout(300)
JOBS = {"even": (), "iterable": ("--uneven", "iterable"), "map": ("--uneven", "map")}


@pytest.fixture(scope="module")
def runs():
    """The three jobs at once (their start-up and waits overlap: CI time); each test reads one."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(len(JOBS)) as pool:
        futs = {k: pool.submit(run_ranks, "lightning_job.py", *a, timeout=150, preload="lightning")
                for k, a in JOBS.items()}
        return {k: f.result() for k, f in futs.items()}


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_even_job_passes(runs):
    run = runs["even"]
    assert run.code == 0, run.stdout + run.stderr
    res = run.results()
    assert res[0] == res[1] == {"ok": True, "steps": [6, 6]}


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_uneven_iterable_raises_instead_of_hanging(runs):
    run = runs["iterable"]
    res = run.results()
    assert run.code != 124, "the job hung"
    # rank 1 finished its 5 batches first and names rank 0 as still training
    assert res[1]["ok"] is False and "DDP101" in res[1]["error"] and "[0]" in res[1]["error"], run.stdout


@pytest.mark.scenario  # launches 2 gloo ranks: not in `make test-fast`
def test_uneven_lengths_raise_on_every_rank_before_the_epoch(runs):
    run = runs["map"]
    res = run.results()
    assert res[0]["ok"] is False and res[1]["ok"] is False
    assert "different lengths" in res[0]["error"] and "{0: 8, 1: 5}" in res[0]["error"]


def test_rank_0_holding_the_store_leaves_the_epoch_end_only_once_every_rank_read(monkeypatch):
    """Without torchrun's agent the store lives in rank 0's process (Lightning's own launcher), which ends right
    after the last epoch: a rank still reading the counts read from a store that was gone (CI, the even job:
    DistNetworkError on rank 1).  Two ranks in threads, rank 1 reading a second late; rank 0's store is dropped
    as soon as its callback returns."""
    import datetime
    import gc
    import threading
    import time
    from types import SimpleNamespace

    import torch.distributed as dist

    from ddp_doctor.fixes import lightning as fl

    host = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    client = dist.TCPStore("127.0.0.1", host.port, is_master=False, wait_for_workers=False,
                           timeout=datetime.timedelta(seconds=10))

    class LateReader:  # rank 1 on a loaded box: its reads come a second after every count is there
        def __init__(self, store):
            self.store = store

        def __getattr__(self, name):
            return getattr(self.store, name)

        def get(self, key):
            time.sleep(1.0)
            return self.store.get(key)

        def multi_get(self, keys):
            time.sleep(1.0)
            return self.store.multi_get(keys)

    stores = {"rank0": host, "rank1": LateReader(client)}
    errors: dict[str, BaseException] = {}
    monkeypatch.setattr(fl, "_default_store", lambda: stores[threading.current_thread().name])

    def rank(r: int) -> None:
        cb = fl.DDPDoctorCallback(timeout=10)
        cb._t0, cb._steps = time.monotonic(), 6
        try:
            cb.on_train_epoch_end(SimpleNamespace(world_size=2, current_epoch=1, global_rank=r), None)
        except BaseException as e:  # noqa: BLE001 (reported below, with the rank)
            errors[f"rank{r}"] = e
        if r == 0:  # rank 0's process ends: its store with it
            stores.pop("rank0")

    threads = [threading.Thread(target=rank, args=(r,), name=f"rank{r}") for r in (0, 1)]
    for t in threads:
        t.start()
    threads[0].join(30)
    del host
    gc.collect()  # rank 0's thread dropped its reference: the store's server stops here
    threads[1].join(30)
    assert not threads[1].is_alive() and not errors, errors
