"""Rendering of check reports: failures name the rank/pair, test and what to try; user text is not markup."""
import io

from rich.console import Console

from ddp_doctor.check.results import check_report
from ddp_doctor.report.check_view import print_check


def _render(report):
    buf = io.StringIO()
    print_check(report, console=Console(file=buf, width=120, color_system=None))
    return buf.getvalue()


def _snapshot():
    data = {}
    for r in range(3):
        data[f"started/{r}"] = {"rank": r, "pid": 10 + r, "local_rank": r, "group_rank": 0, "host": "h"}
        data[f"hello/{r}"] = {"rank": r, "host": "h", "torch": "2.13", "python": "3.11", "device": "cpu",
                              "backend": "gloo", "device_name": "cpu", "cuda": None, "nccl": None}
        data[f"res/{r}/rendezvous"] = {"status": "pass", "duration_s": 0.1}
        data[f"at/{r}"] = {"test": "pairs"}
    ok = {"ok": True, "status": "pass", "time_s": 0.001}
    bad = {"ok": False, "status": "timeout", "op": "recv from rank 2", "error": "RuntimeError: [x.cc:1] timed out"}
    data["res/0/pairs"] = {"status": "timeout", "waiting_for": [2], "detail": "recv from rank 2: [/a/b.cc:78] timed out",
                           "items": [{"pair": [0, 1], "peer": 1, **ok}, {"pair": [0, 2], "peer": 2, **bad}]}
    data["res/1/pairs"] = {"status": "pass", "items": [{"pair": [0, 1], "peer": 0, **ok}, {"pair": [1, 2], "peer": 2, **ok}]}
    data["res/2/pairs"] = {"status": "pass", "items": [{"pair": [0, 2], "peer": 0, **ok}, {"pair": [1, 2], "peer": 1, **ok}]}
    data["audit/0"] = {"node": 0, "host": "h", "local_ranks": 3, "checks": [
        {"check": "/dev/shm", "status": "fail", "value": "1 MiB free", "detail": "need [lots]", "code": "DDP504",
         "severity": None, "fix": "--shm-size=16g"}]}
    return {"master": {"world_size": 3, "group_world_size": 1}, "data": data, "stuck": {}, "killed": []}


def test_failures_render_with_rank_pair_test_and_fix():
    report = check_report(_snapshot(), deadline=2.0)
    out = _render(report)
    assert "DDP502 link-failed [ranks 0,2; test pairs] Link 0 <-> 2 failed" in out
    assert "DDP504 shm-too-small" in out and "try: --shm-size=16g" in out
    assert "[/a/b.cc:78]" in out or "x.cc" in out            # brackets printed literally, not parsed as markup
    assert "pairs: send/recv" in out and "TIMEOUT" in out
    assert "FAIL: failed: pairs" in out


def test_passing_report_renders_the_verdict():
    snap = _snapshot()
    for r in range(3):
        snap["data"][f"res/{r}/pairs"] = {"status": "pass", "items": []}
    snap["data"]["audit/0"]["checks"] = []
    report = check_report(snap, deadline=2.0)
    assert report["verdict"] == "fail"   # later tests did not run
    out = _render(report)
    assert "Tests (3 ranks" in out and "not-run" in out
