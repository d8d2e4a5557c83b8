"""benchmarks/gpu_check.sh stays runnable without a GPU: its CPU dry run, its failure path, its judges.

The GPU run itself happens only where a GPU is lent (issue 26); these tests keep the script from rotting
in between: every step's CPU variant runs, the real-GPU tests are collected and skip visibly, and a
failing step makes the script exit non-zero with the failure in its summary."""
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_doctor.gpu import UtilizationSample

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.sh"
STEPS = ["env", "tests", "overhead", "prefetch", "check", "ddp401"]

_spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


def _run(out: Path, *args: str, env_extra: dict | None = None, timeout: float = 240) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, **(env_extra or {}))
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), *args, str(out)], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_every_gpu_marked_test_file_is_run_by_the_script():
    listed = set(re.search(r'GPU_TEST_FILES="([^"]+)"', SCRIPT.read_text()).group(1).split())
    marked = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")
              if "pytest.mark.gpu" in p.read_text() and p.name != Path(__file__).name}
    assert marked == listed


def test_judge_tests():
    ok = {"id": "a::t", "outcome": "passed", "message": ""}
    two = {"id": "b::t", "outcome": "skipped", "message": "needs >= 2 CUDA GPUs and NVML: skipped"}
    nocuda = {"id": "c::t", "outcome": "skipped", "message": "no CUDA device: needs one"}
    assert gpu_check.judge_tests([ok, two], dry_run=False) == []
    assert gpu_check.judge_tests([two, nocuda], dry_run=True) == []
    assert "skipped on the GPU machine" in gpu_check.judge_tests([ok, nocuda], dry_run=False)[0]
    assert "failed" in gpu_check.judge_tests([dict(ok, outcome="failed", message="boom")], dry_run=True)[0]
    assert "without a reason" in gpu_check.judge_tests([dict(nocuda, message="")], dry_run=True)[0]
    assert "no test collected" in gpu_check.judge_tests([], dry_run=True)[0]


def test_junit_outcomes(tmp_path):
    xml = tmp_path / "j.xml"
    xml.write_text('<testsuites><testsuite><testcase classname="m" name="a" time="0.5"/>'
                   '<testcase classname="m" name="b"><skipped message="no CUDA device"/></testcase>'
                   '<testcase classname="m" name="c"><failure message="assert 1 == 2"/></testcase>'
                   '</testsuite></testsuites>')
    got = [(c["id"], c["outcome"], c["message"]) for c in gpu_check.junit_outcomes(str(xml))]
    assert got == [("m::a", "passed", ""), ("m::b", "skipped", "no CUDA device"), ("m::c", "failed", "assert 1 == 2")]


def test_utilization_stats_keep_the_training_window_only():
    samples = [UtilizationSample(t, (pct,)) for t, pct in [(0.5, 99), (1.0, 0), (1.5, 100), (2.0, 0), (2.5, 0),
                                                           (3.5, 99)]]
    u = gpu_check.utilization_stats(samples, 1.0, 2.5)
    assert u["readings"] == [0, 100, 0, 0] and u["mean_pct"] == 25.0 and u["share_at_most_5_pct"] == 0.75
    assert gpu_check.utilization_stats(None, 0, 1) is None


@pytest.mark.scenario  # it launches single-rank jobs under ddp-doctor run and ddp-doctor check
@pytest.mark.timeout(300)
def test_cpu_dry_run(tmp_path):
    p = _run(tmp_path, "--cpu-dry-run")
    log = (tmp_path / "log.txt").read_text() if (tmp_path / "log.txt").exists() else p.stdout + p.stderr
    assert p.returncode == 0, log[-6000:]
    # what the device tool brings back: at most 8 files, plainly named
    assert sorted(f.name for f in tmp_path.iterdir()) == ["artefacts.tar.gz", "log.txt", "summary.json", "summary.txt"]
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["mode"] == "cpu-dry-run" and s["measured_on_gpu"] is False and s["failed"] == []
    assert [(x["name"], x["status"]) for x in s["steps"]] == [(n, "pass") for n in STEPS]
    fig = {x["name"]: x["figures"] for x in s["steps"]}
    counts = fig["tests"]["counts"]
    assert counts["failed"] == counts["error"] == 0 and counts["passed"] + counts["skipped"] >= 8
    if not fig["env"]["cuda_available"]:  # a machine without a GPU: every real-GPU test skipped with a reason
        assert counts["passed"] == 0 and all(c["message"] for c in fig["tests"]["cases"])
    assert fig["overhead"]["backend"] == "gloo" and fig["overhead"]["median"]["a_doctor"] > 0
    assert fig["prefetch"]["prefetch"]["device"] == "cpu" and fig["prefetch"]["prefetch"]["on"] > 0
    assert fig["check"]["report"]["verdict"] == "ok"
    starved = fig["ddp401"]["runs"]["starved"]
    assert "DDP401" in starved["codes"] and starved["steps"] >= 15
    text = (tmp_path / "summary.txt").read_text()
    assert "nothing here was measured on a GPU" in text and "ALL STEPS PASSED" in text


def test_failing_step_fails_the_script(tmp_path):
    """GPU mode with CUDA hidden: the env step fails, the script exits 1 and says which step failed."""
    p = _run(tmp_path, "--steps", "env", env_extra={"CUDA_VISIBLE_DEVICES": ""}, timeout=120)
    assert p.returncode == 1, p.stdout + p.stderr
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["mode"] == "gpu" and s["measured_on_gpu"] is False and s["failed"] == ["env"]
    assert [x["status"] for x in s["steps"]] == ["fail"] + ["not-selected"] * 5
    assert "sees no CUDA device" in (tmp_path / "log.txt").read_text()
    assert "SOME STEPS FAILED" in (tmp_path / "summary.txt").read_text()


def test_usage_errors(tmp_path):
    assert _run(tmp_path, "--no-such-option").returncode == 2
    p = _run(tmp_path, "--steps", "env,nope")
    assert p.returncode == 2 and "no step 'nope'" in p.stderr
    env = dict(os.environ, PYTHON=sys.executable)
    env.pop("OUT", None)
    p = subprocess.run(["bash", str(SCRIPT)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "output folder" in p.stderr
