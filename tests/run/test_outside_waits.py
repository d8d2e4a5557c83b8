"""A rank that waits on a peer outside the job for longer than the limit (issue 34): a stall is a diagnosis, not
a kill.  Real 2-rank gloo jobs (``scripts/outside_wait.py``), short: a 6 s limit, a 14 s wait, run together
in one module fixture.

- the correct ones (a slow service reply, a throttled upload) run to exit 0 with verdict ok; the slow reply is
  diagnosed at the limit (a ``stalled`` report written while the job runs) and ends with an info finding naming
  the service's address;
- the failing twins: a service that never replies is diagnosed within the limit + 5 s with its address and
  stopped at the job's own (short) process-group timeout; a child that never exits is stopped at the limit by
  ``--stop-on-stall``, its command line named.
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

import jsonschema  # noqa: E402 (a test dependency: missing, it must fail loudly)

from ddp_doctor.report import REPORT_JSON_SCHEMA  # noqa: E402

pytestmark = [pytest.mark.scenario, pytest.mark.timing, pytest.mark.timeout(600)]

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "scripts" / "outside_wait.py"
SRC = HERE.parents[1] / "src"
LIMIT_S = 6
# mode: (extra ddp-doctor options, extra environment)
CASES = {
    "slow_reply": ([], {}),
    "upload": ([], {}),
    "no_reply": ([], {"DDP_TIMEOUT": "20"}),
    "child_forever": (["--stop-on-stall"], {}),
}


def _marker() -> int:
    for no, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if "subprocess.run" in line and "expect: DDP205" in line:
            return no
    raise AssertionError("no marker")


def _run(mode: str, tmp: Path) -> dict:
    """Run one job; poll its report file meanwhile: the first version written is the stall's, if any."""
    report = tmp / f"{mode}.json"
    opts, env_extra = CASES[mode]
    cmd = [sys.executable, "-m", "ddp_doctor", "run", "--report", str(report), "--hang-timeout", str(LIMIT_S), *opts,
           "--nproc-per-node", "2", "--monitor-interval", "0.1", str(SCRIPT), mode]
    env = dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""), OUTSIDE_WAIT_S="14",
               **env_extra)
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    first = None
    out: list[str] = []
    import threading

    reader = threading.Thread(target=lambda: out.append(proc.stdout.read()), daemon=True)
    reader.start()
    end = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < end:
        if first is None and report.exists():
            try:
                first = json.loads(report.read_text())
            except ValueError:
                pass  # being written
        time.sleep(0.2)
    if proc.poll() is None:
        os.killpg(proc.pid, 9)
    proc.wait()
    reader.join(5)
    final = json.loads(report.read_text()) if report.exists() else None
    return {"rc": proc.returncode, "first": first, "report": final, "out": "".join(out)}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("outside")
    with ThreadPoolExecutor(len(CASES)) as pool:  # (they mostly wait)
        futs = {m: pool.submit(_run, m, tmp) for m in CASES}
        return {m: f.result() for m, f in futs.items()}


def _info_205(rep: dict) -> dict:
    (f,) = [f for f in rep["findings"] if f["code"] == "DDP205" and f.get("source") == "runtime"]
    return f


def test_a_slow_reply_is_diagnosed_then_ok_with_the_peer_named(results):
    res = results["slow_reply"]
    rep, first = res["report"], res["first"]
    assert rep is not None and res["rc"] == 0, res["out"][-3000:]
    jsonschema.validate(rep, REPORT_JSON_SCHEMA)
    assert rep["verdict"] == "ok" and rep["exit_code"] == 0
    assert not [f for f in rep["findings"] if f["severity"] == "error"], rep["findings"]
    f = _info_205(rep)
    assert f["severity"] == "info" and f["ranks"] == [0]
    stall = f["evidence"]["stall"]
    peer = stall["outside"]["0"]
    assert peer["kind"] == "socket" and peer["call"] == "recvfrom" and peer["remote"].startswith("127.0.0.1:")
    assert peer["remote"] in f["message"] and "ask_service()" in f["message"]
    assert LIMIT_S < stall["lasted_s"] <= 25
    # the diagnosis was written at the limit, while the job ran
    assert first is not None and first["verdict"] == "stalled" and first["exit_code"] is None, first
    jsonschema.validate(first, REPORT_JSON_SCHEMA)
    assert first["detection"]["stalled_s_at_detection"] <= LIMIT_S + 5
    (d,) = [f for f in first["findings"] if f["code"] == "DDP205"]
    assert d["ranks"] == [0] and peer["remote"] in d["message"] and "Nothing proves the job stuck" in d["message"]


def test_a_throttled_upload_is_never_stopped(results):
    """One long sendall to a service that reads slowly: its send queue drains (a sign of life)."""
    res = results["upload"]
    rep = res["report"]
    assert rep is not None and res["rc"] == 0, res["out"][-3000:]
    assert rep["verdict"] == "ok" and not [f for f in rep["findings"] if f["severity"] == "error"]
    assert res["first"]["verdict"] == "ok", "no stall: the drained queue was a sign of life all along"
    assert not [f for f in rep["findings"] if "stall" in f["evidence"]], rep["findings"]


def test_a_service_that_never_replies_is_diagnosed_at_the_limit_and_stopped_at_the_job_timeout(results):
    res = results["no_reply"]
    rep, first = res["report"], res["first"]
    assert rep is not None and res["rc"] == 1, res["out"][-3000:]
    assert first is not None and first["verdict"] == "stalled", first
    assert first["detection"]["stalled_s_at_detection"] <= LIMIT_S + 5
    (d,) = [f for f in first["findings"] if f["code"] == "DDP205"]
    assert "127.0.0.1:" in d["message"] and d["ranks"] == [0]
    assert rep["verdict"] == "hang" and rep["detection"]["reason"] == "hang"
    f = rep["findings"][0]
    assert f["code"] == "DDP205" and f["ranks"] == [0] and "127.0.0.1:" in f["message"]


def test_a_child_that_never_exits_is_stopped_by_stop_on_stall(results):
    res = results["child_forever"]
    rep = res["report"]
    assert rep is not None and res["rc"] == 1, res["out"][-3000:]
    assert rep["verdict"] == "hang" and rep["detection"]["stalled_s_at_detection"] <= LIMIT_S + 5
    f = rep["findings"][0]
    assert f["code"] == "DDP205" and f["ranks"] == [0], rep["findings"]
    assert f["location"]["line"] == _marker() and "(sleep " in f["message"], f["message"]
