"""``ddp-doctor run`` on real 2-rank gloo jobs: each failure and its healthy twin.

The jobs run concurrently (a few at a time) in one module fixture so the whole
file stays within a couple of minutes on a loaded 2-core machine.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

psutil = pytest.importorskip("psutil")
jsonschema = pytest.importorskip("jsonschema")

from ddp_doctor.report import REPORT_JSON_SCHEMA  # noqa: E402

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(900)]

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "scripts"
SRC = HERE.parents[1] / "src"
PARALLEL = int(os.environ.get("DDP_DOCTOR_TEST_PARALLEL", "5"))

# name: (verdict, exit code (None: any non-zero), {code: (ranks, marker line or None)}, extra options)
CASES = {
    # (the failure library with clean twins is tests/scenarios, run by test_scenarios_run.py; these add:
    #  a barrier mid-training, an explicit --hang-timeout with loader-worker stacks, DDP102 + timing, SIGKILL)
    "barrier_rank0": ("hang", None, {"DDP201": ([0], True)}, []),
    "sigkill_rank1": ("crash", 137, {"DDP204": ([1], False)}, []),  # killed anywhere: no line to check
    "loader_stall": ("hang", None, {"DDP205": ([0, 1], True)}, ["--hang-timeout", "8"]),
    "no_set_epoch": ("ok", 0, {"DDP102": ([0, 1], True)}, []),
}


def _marker_line(name: str, code: str) -> int | None:
    for no, line in enumerate((SCRIPTS / f"{name}.py").read_text().splitlines(), 1):
        if f"expect: {code}" in line:
            return no
    return None


def _leftovers(tag: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if tag in " ".join(p.info["cmdline"] or []):
                out.append(p.info["pid"])
        except psutil.Error:
            pass
    return out


def _run(name: str, tmp: Path) -> dict:
    report = tmp / f"{name}.json"
    extra = CASES[name][3]
    cmd = [sys.executable, "-m", "ddp_doctor", "run", "--report", str(report), *extra,
           "--nproc-per-node", "2", "--monitor-interval", "0.1", str(SCRIPTS / f"{name}.py")]
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, _ = proc.communicate()
    time.sleep(0.5)
    left = _leftovers(str(SCRIPTS / f"{name}.py"))
    for pid in left:
        try:
            os.kill(pid, 9)
        except OSError:
            pass
    data = json.loads(report.read_text()) if report.exists() else None
    return {"rc": proc.returncode, "report": data, "out": out, "elapsed": time.monotonic() - t0, "leftovers": left}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("run")
    with ThreadPoolExecutor(PARALLEL) as pool:
        futs = {name: pool.submit(_run, name, tmp) for name in CASES}
        return {name: f.result() for name, f in futs.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_diagnosis(results, name):
    verdict, code, expected, _ = CASES[name]
    res = results[name]
    rep = res["report"]
    assert rep is not None, res["out"][-3000:]
    jsonschema.validate(rep, REPORT_JSON_SCHEMA)
    verdicts = verdict if isinstance(verdict, tuple) else (verdict,)
    assert rep["verdict"] in verdicts, (rep["verdict"], [f["message"] for f in rep["findings"]], res["out"][-2000:])
    if code is None:
        assert res["rc"] != 0
    else:
        assert res["rc"] == code, res["out"][-2000:]
    assert rep["exit_code"] == res["rc"]
    assert not res["leftovers"], f"processes left behind: {res['leftovers']}"
    by_code = {f["code"]: f for f in rep["findings"]}
    for c, (ranks, check_line) in expected.items():
        assert c in by_code, (c, [(f["code"], f["message"]) for f in rep["findings"]])
        f = by_code[c]
        if ranks is not None:
            assert f["ranks"] == ranks, f
        if check_line:
            assert f["location"] and f["location"]["line"] == _marker_line(name, c), f
            assert f["location"]["path"].endswith(f"{name}.py")
        assert f["fix"] and f["message"]
    if verdicts == ("ok",):
        assert not [f for f in rep["findings"] if f["severity"] == "error"], rep["findings"]
    det = rep.get("detection")
    if det and det.get("reason") == "hang":
        # the hang limit is met, the report follows within seconds
        assert det["stalled_s_at_detection"] <= rep["hang_timeout_s"] + 2.0
        assert det["detect_to_stopped_s"] <= 8.0
    assert len(rep["ranks"]) == 2


def test_healthy_report_has_timing(results):
    rep = results["no_set_epoch"]["report"]
    for r in rep["ranks"]:
        assert r["state"] == "finished"
        assert r["step"] == 12 and r["steps_by_epoch"] == [4, 4, 4]
        assert r["timing"]["steps"] == 12
        assert r["loaders"][0]["sampler"]["set_epoch_calls"] == 0
        assert r["loaders"][0]["len"] == 4
