"""`ddp_doctor.watch()` at the top of a Ray Train driver's file (2 CPU workers on a local Ray): the driver is no
rank; the TorchTrainer it makes runs the training function with `watch()` first in each worker.  Its
own tier (`-m ray`; `make test` runs it): starting Ray costs tens of seconds.  The workers run in Ray's
working directory; the report lands where the driver was launched (the PWD the workers inherit)."""
from __future__ import annotations

import sys

import pytest
from launch_helpers import HERE, ended, expect, rank_env, wait_report

pytestmark = [pytest.mark.scenario, pytest.mark.ray, pytest.mark.timing]  # Ray's start-up and teardown race a loaded box
RAY = HERE / "scripts" / "ray_watch.py"


@pytest.mark.parametrize("mode", ["ok", "barrier", "raise"])
def test_ray_train_watch(procs, tmp_path, mode):
    procs.start([sys.executable, str(RAY), mode, str(tmp_path / "ray")], rank_env(PWD=str(tmp_path)), cwd=tmp_path)
    rep = wait_report(tmp_path / "ddp-doctor-report.json", procs, timeout=240)
    expect(rep, RAY, mode, "ray train")
    assert rep["report_path"] == str(tmp_path / "ddp-doctor-report.json")
    ended(procs, mode, timeout=120)
