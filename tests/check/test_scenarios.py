"""``ddp-doctor check`` for real: 2-4 gloo ranks, injected faults, a two-node job on 127.0.0.1.

Each fault must be reported with the right rank and test within the deadline, the command
must exit non-zero, and no process it started may be left behind.
"""
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

pytestmark = pytest.mark.scenario

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _env(fault=None, tag=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = SRC + os.pathsep + env.get("PYTHONPATH", "")
    env["DDP_DOCTOR_TEST_TAG"] = tag or uuid.uuid4().hex
    env.pop("DDP_DOCTOR_CHECK_FAULT", None)
    if fault:
        env["DDP_DOCTOR_CHECK_FAULT"] = fault
    env["COLUMNS"] = "120"  # the texts checked below, laid out at this width (a pytest-xdist worker sets 80)
    return env


def _leftovers(tag):
    """Processes still running that were started by the run tagged ``tag``."""
    left = []
    for p in psutil.process_iter(["pid"]):
        try:
            if p.environ().get("DDP_DOCTOR_TEST_TAG") == tag:
                left.append(p.pid)
        except (psutil.Error, OSError):
            continue
    return left


def _no_leftovers(tag, grace_s=2.0):
    """True once no process of the run tagged ``tag`` is left (a moment's grace for their exit)."""
    end = time.monotonic() + grace_s
    while _leftovers(tag) and time.monotonic() < end:
        time.sleep(0.1)
    return _leftovers(tag) == []


def run_check(tmp_path, *args, fault=None, timeout=120):
    tag = uuid.uuid4().hex
    report = tmp_path / f"report-{tag[:8]}.json"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "ddp_doctor", "check", "--report", str(report), *args],
                          env=_env(fault, tag), capture_output=True, text=True, timeout=timeout)
    elapsed = time.monotonic() - t0
    assert _no_leftovers(tag), "processes left behind"
    data = json.loads(report.read_text()) if report.exists() else None
    assert data is not None, proc.stdout + proc.stderr
    return proc, data, elapsed


def _errors(report):
    return [(f["code"], f["ranks"], f["evidence"].get("test")) for f in report["findings"] if f["severity"] == "error"]


def _test(report, name):
    return next(t for t in report["tests"] if t["name"] == name)


def test_healthy_four_ranks_pass_and_print_tables(tmp_path):
    proc, report, _ = run_check(tmp_path, "--nproc-per-node", "4", "--deadline", "10", "--sizes", "4K,64K,1M")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    import jsonschema

    from ddp_doctor.check import CHECK_JSON_SCHEMA

    jsonschema.validate(report, CHECK_JSON_SCHEMA)
    assert report["schema"] == "ddp-doctor/check/v1" and report["verdict"] == "ok" and report["world_size"] == 4
    assert all(t["status"] == "pass" for t in report["tests"])
    assert len(_test(report, "pairs")["pairs"]) == 6
    assert [(row["bytes"], row["ok"]) for row in report["bandwidth"]] == [(4096, True), (65536, True), (1 << 20, True)]
    assert report["bandwidth"][0]["busbw_GBps"] > 0
    assert {r["state"] for r in report["ranks"]} == {"ok"} and len({r["pid"] for r in report["ranks"]}) == 4
    for title in ("Ranks", "ring", "pairs", "barrier", "broadcast", "all_gather", "all_reduce bandwidth",
                  "Environment of node 0", "PASS"):
        assert title in proc.stdout
    assert "Traceback" not in proc.stdout + proc.stderr


def test_rank_that_exits_during_all_reduce(tmp_path):
    proc, report, _ = run_check(tmp_path, "--nproc-per-node", "2", "--deadline", "5", "--sizes", "4K,64K",
                                fault="exit:rank=1:test=all_reduce")
    assert proc.returncode == 1
    assert ("DDP204", [1], "all_reduce") in _errors(report)
    assert {r["rank"]: r["state"] for r in report["ranks"]}[1] == "exited"
    assert [t["status"] for t in report["tests"][:6]] == ["pass"] * 6   # everything before passed
    assert "Rank 1 exited with code 3 during 'all_reduce'" in proc.stdout


def test_rank_that_delays_past_the_deadline_in_ring(tmp_path):
    deadline = 2.0
    proc, report, elapsed = run_check(tmp_path, "--nproc-per-node", "2", "--deadline", str(deadline),
                                      fault="delay:rank=1:test=ring")
    assert proc.returncode == 1
    errors = _errors(report)
    assert errors[0][:3] == ("DDP502", [1], "ring"), errors
    hung = report["findings"][0]
    assert hung["evidence"]["kind"] == "hung" and hung["evidence"]["waiting"]
    assert {r["rank"]: r["state"] for r in report["ranks"]} == {0: "ok", 1: "hung"}
    assert any(p["signal"] in ("SIGTERM", "SIGKILL") for p in report["stopped_processes"])
    # the ring test itself is decided within deadline + grace, not after the sleeping rank's hour
    assert report["duration_s"] < 60 and elapsed < 90


def test_bad_pair_wrong_data_and_tiny_shm_are_each_named(tmp_path):
    proc, report, _ = run_check(tmp_path, "--nproc-per-node", "3", "--deadline", "4", "--sizes", "4K,64K",
                                fault="drop:pair=0-2:test=pairs;wrong:rank=1:test=all_reduce;shm:bytes=1000000")
    assert proc.returncode == 1
    errors = _errors(report)
    assert ("DDP502", [0, 2], "pairs") in errors            # only that link
    assert ("DDP503", [1], "all_reduce") in errors           # only that rank
    assert ("DDP504", [0, 1, 2], None) in errors             # the node's ranks
    pairs = {tuple(p["pair"]): p["status"] for p in _test(report, "pairs")["pairs"]}
    assert pairs == {(0, 1): "pass", (0, 2): "timeout", (1, 2): "pass"}
    for name in ("barrier", "broadcast", "all_gather"):      # a bad pair does not stop the collectives
        assert _test(report, name)["status"] == "pass"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_nodes(tmp_path, deadline, fault=None):
    port = _free_port()
    tag = uuid.uuid4().hex
    procs, paths = [], []
    for node in range(2):
        path = tmp_path / f"node{node}.json"
        paths.append(path)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ddp_doctor", "check", "--report", str(path), "--deadline", str(deadline),
             "--nnodes", "2", "--node-rank", str(node), "--nproc-per-node", "1", "--sizes", "4K,64K",
             "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", tag[:8]],
            env=_env(fault, tag=tag), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=150)[0] for p in procs]
    assert _no_leftovers(tag)
    return [p.returncode for p in procs], [json.loads(p.read_text()) for p in paths], outs


def test_two_nodes_on_this_machine_form_one_job(tmp_path):
    codes, reports, outs = _two_nodes(tmp_path, 10)
    assert codes == [0, 0], outs
    for report in reports:
        assert report["world_size"] == 2 and report["nnodes"] == 2 and report["verdict"] == "ok"
        assert len(report["audit"]) == 2                      # both nodes audited, seen from either node
    summary = [[(t["name"], t["status"]) for t in r["tests"]] for r in reports]
    assert summary[0] == summary[1]
    assert dict(summary[0])["pairs"] == "skip"                # every-pair test is single-node only


def test_two_nodes_agree_on_a_rank_that_hangs_on_node_1(tmp_path):
    codes, reports, outs = _two_nodes(tmp_path, 3, fault="delay:rank=1:test=barrier")
    assert codes == [1, 1], outs
    for report in reports:
        assert _errors(report) == [("DDP502", [1], "barrier")]
        assert report["duration_s"] < 60
    assert [[(t["name"], t["status"]) for t in r["tests"]] for r in reports][0] == \
        [[(t["name"], t["status"]) for t in r["tests"]] for r in reports][1]
