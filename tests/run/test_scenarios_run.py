"""Every ``issue: run`` scenario of tests/scenarios under ``ddp-doctor run``: verdict, codes, ranks, marker
lines, clean twins without error findings, no process left behind (scenarios.json is the single truth).

The parity scenarios (``manifest.PARITY``) run in tests/parity instead, checked there by the same
``manifest.assert_run_report`` and compared with attach's and Flight Recorder's views of the same job.

Jobs run a few at a time (DDP_DOCTOR_TEST_PARALLEL, default 4; 3 beside another pytest worker) in one
module fixture.
"""
from __future__ import annotations

import json
import os
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
import manifest  # noqa: E402 (tests/scenarios, put on the path above)

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(1800)]  # one fixture runs every job
NAMES = [n for n in manifest.names(issue="run") if n not in manifest.PARITY]
# (fewer at a time beside a second pytest worker, so the machine carries about as many jobs as before)
PARALLEL = int(os.environ.get("DDP_DOCTOR_TEST_PARALLEL", "3" if os.environ.get("PYTEST_XDIST_WORKER") else "4"))


def _one(name: str, tmp: Path) -> dict:
    out = tmp / f"{name}.json"
    env = manifest.scenario_env(name, dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    res = manifest.run_command([sys.executable, "-m", "ddp_doctor", "run", "--report", str(out),
                                *manifest.doctor_options(name), *manifest.torchrun_argv(name)], timeout=240, env=env)
    return {"res": res, "report": json.loads(out.read_text()) if out.exists() else None}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("scen")
    with ThreadPoolExecutor(PARALLEL) as pool:
        futs = {n: pool.submit(_one, n, tmp) for n in NAMES}
        return {n: f.result() for n, f in futs.items()}


@pytest.mark.parametrize("name", NAMES)
def test_scenario(results, name):
    manifest.assert_run_report(name, results[name]["res"], results[name]["report"])
