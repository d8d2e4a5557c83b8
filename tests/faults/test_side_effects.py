"""The probe has no side effects on the user's objects: models and samplers it saw are freed with the user's
last reference (RSS stays flat over a sweep of models), and it never asks len() of an IterableDataset loader."""
from __future__ import annotations

import json
import re

import pytest

from conftest import SCRIPTS, env, start_run

pytestmark = pytest.mark.scenario  # real multi-rank jobs: the full tier (make test), not test-fast


def test_rss_stays_flat_when_a_job_builds_models_repeatedly(tmp_path):
    report = tmp_path / "r.json"
    # (--hang-timeout: a full gc.collect() holds the GIL for seconds on a loaded box, silencing the probe)
    run = start_run(["--quiet", "--no-lint", "--hang-timeout", "120", "--report", str(report), "--nproc-per-node", "2",
                     str(SCRIPTS / "rebuild_models.py")], env=env(ROUNDS="60"))
    out = run.communicate(timeout=300)[0]
    # (the probe's thread used to run the GC that tore down dropped DDP models: the rank aborted at exit)
    assert run.returncode == 0, out[-3000:]
    assert "terminate called" not in out, out[-3000:]
    growth = {int(r): float(g) for r, g in re.findall(r"RSS_GROWTH_MIB (\d) (-?[\d.]+)", out)}
    assert set(growth) == {0, 1}, out[-3000:]
    # 54 rounds x (1 MiB of data + 2 MiB of parameters + their grads) would be >= 200 MiB if the probe kept them
    assert max(growth.values()) < 40, growth
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "ok", rep["findings"]
    ranks = rep["ranks"]
    assert all(len(r.get("loaders") or []) <= 32 and len(r.get("ddp") or []) <= 32 for r in ranks)


def test_iterable_dataset_loader_under_warnings_as_errors(tmp_path):
    run = start_run(["--quiet", "--no-lint", "--nproc-per-node", "2", str(SCRIPTS / "iterable_loader.py")],
                    env=env(PYTHONWARNINGS="error"))
    out = run.communicate(timeout=300)[0]
    assert run.returncode == 0, out[-3000:]
    assert out.count("TRAINING DONE") == 2, out[-3000:]
