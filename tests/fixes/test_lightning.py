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
