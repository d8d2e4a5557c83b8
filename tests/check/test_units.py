"""Fast unit tests of check's pure parts: busbw math, sizes, pair schedule, faults, env audit, diagnosis."""
import itertools

import pytest

from ddp_doctor.check import audit, faults, plan
from ddp_doctor.check.results import bandwidth_table, check_report
from ddp_doctor.findings import CATALOGUE


# ----------------------------------------------------------------------------- busbw / sizes
def test_busbw_follows_nccl_tests_formula():
    # nccl-tests: algbw = S / t; all_reduce busbw = algbw * 2(n-1)/n
    assert plan.algbw(1_000_000, 0.001) == pytest.approx(1e9)
    assert plan.busbw("all_reduce", 1_000_000, 0.001, 4) == pytest.approx(1e9 * 2 * 3 / 4)
    assert plan.busbw("all_reduce", 1_000_000, 0.001, 2) == pytest.approx(1e9)
    assert plan.busbw("all_gather", 1_000_000, 0.001, 8) == pytest.approx(1e9 * 7 / 8)
    assert plan.busbw("broadcast", 1_000_000, 0.001, 8) == pytest.approx(1e9)
    assert plan.busbw("all_reduce", 1_000_000, 0.001, 1) == 0.0
    assert plan.algbw(10, 0) == 0.0


def test_bandwidth_table_uses_the_slowest_rank():
    results = {0: {"items": [{"bytes": 1 << 20, "time_s": 0.001, "ok": True}]},
               1: {"items": [{"bytes": 1 << 20, "time_s": 0.002, "ok": True}]}}
    (row,) = bandwidth_table(results, 2)
    assert row["time_s"] == 0.002 and row["busbw_GBps"] == pytest.approx((1 << 20) / 0.002 / 1e9)


def test_sizes_parse_and_format():
    assert plan.parse_sizes("4K, 1M,512,4k") == [512, 4096, 1 << 20]
    assert plan.parse_size("1.5M") == int(1.5 * (1 << 20))
    assert plan.format_size(4096) == "4 KiB" and plan.format_size(3 << 20) == "3 MiB"
    for bad in ("", "x", "-1K", "4Q"):
        with pytest.raises(ValueError):
            plan.parse_size(bad)


@pytest.mark.parametrize("n", range(2, 10))
def test_pair_rounds_cover_every_pair_once_and_each_rank_once_per_round(n):
    rounds = plan.pair_rounds(n)
    seen = [p for rnd in rounds for p in rnd]
    assert sorted(seen) == list(itertools.combinations(range(n), 2))
    for rnd in rounds:
        members = [r for p in rnd for r in p]
        assert len(members) == len(set(members))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)


# ----------------------------------------------------------------------------- faults
def test_fault_spec_parsing_and_matching():
    fs = faults.parse("exit:rank=1:test=all_reduce; delay:rank=2:test=ring:secs=5;drop:pair=1-2;shm:bytes=10")
    assert [f.kind for f in fs] == ["exit", "delay", "drop", "shm"]
    assert faults.find(fs, "exit", 1, "all_reduce") and not faults.find(fs, "exit", 0, "all_reduce")
    assert not faults.find(fs, "exit", 1, "ring")
    assert faults.find(fs, "delay", 2, "ring").params["secs"] == "5"
    assert fs[2].pair() == (1, 2) and fs[2].applies(2, "pairs") and not fs[2].applies(0, "pairs")
    assert faults.parse(None) == [] and faults.parse("") == []
    for bad in ("boom:rank=1", "exit:rank"):
        with pytest.raises(ValueError):
            faults.parse(bad)


# ----------------------------------------------------------------------------- env audit
FACTS = {"shm_free": 16 << 30, "shm_total": 16 << 30, "nofile": [65536, 65536], "nproc": [None, None], "cpus": 64}


def _codes(checks):
    return sorted(c["code"] for c in checks if c["code"])


def test_audit_healthy_node_has_no_findings():
    checks = audit.audit_node(FACTS, {"OMP_NUM_THREADS": "8"}, local_ranks=4, workers=4)
    assert _codes(checks) == [] and all(c["status"] in ("ok", "info") for c in checks)


def test_audit_shm_too_small_for_ranks_times_workers():
    facts = {**FACTS, "shm_free": 64 << 20, "shm_total": 64 << 20}    # docker's default
    checks = audit.audit_node(facts, {}, local_ranks=4, workers=4, batch_bytes=8 << 20)
    (shm,) = [c for c in checks if c["code"] == "DDP504"]
    assert "256 MiB" in shm["detail"] and shm["status"] == "fail"     # 4 x 4 x 2 x 8 MiB
    assert not _codes(audit.audit_node(facts, {}, local_ranks=4, workers=0))


def test_audit_limits_and_cpus():
    facts = {**FACTS, "nofile": [1024, 4096], "nproc": [256, 256], "cpus": 8}
    checks = audit.audit_node(facts, {"OMP_NUM_THREADS": "8"}, local_ranks=4, workers=4)
    assert _codes(checks) == ["DDP505", "DDP505", "DDP506", "DDP506"]


def test_audit_deprecated_contradictory_and_slow_path_env():
    env = {"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": "0", "NCCL_ASYNC_ERROR_HANDLING": "1",
           "NCCL_P2P_DISABLE": "1", "NCCL_IB_DISABLE": "1"}
    checks = audit.audit_node(FACTS, env, local_ranks=2, nnodes=1)
    by_name = {c["check"]: c for c in checks if c["code"] == "DDP507"}
    assert by_name["NCCL_BLOCKING_WAIT"]["severity"] == "error" and "contradictory" in by_name["NCCL_BLOCKING_WAIT"]["detail"]
    assert "TORCH_NCCL_ASYNC_ERROR_HANDLING" in by_name["NCCL_ASYNC_ERROR_HANDLING"]["detail"]
    assert "NCCL_P2P_DISABLE" in by_name and "NCCL_IB_DISABLE" not in by_name   # IB only matters across nodes
    assert "NCCL_IB_DISABLE" in {c["check"] for c in audit.audit_node(FACTS, env, local_ranks=2, nnodes=2) if c["code"]}


def test_audit_cuda_visible_devices_vs_ranks():
    assert _codes(audit.audit_node(FACTS, {"CUDA_VISIBLE_DEVICES": "0,1"}, local_ranks=4, gpus=2)) == ["DDP509", "DDP509"]
    assert _codes(audit.audit_node(FACTS, {"CUDA_VISIBLE_DEVICES": "0,0"}, local_ranks=2, gpus=2)) == ["DDP509"]
    assert _codes(audit.audit_node(FACTS, {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, local_ranks=4, gpus=4)) == []
    assert _codes(audit.audit_node(FACTS, {"CUDA_VISIBLE_DEVICES": "0"}, local_ranks=4, gpus=None)) == []  # CPU run


def test_version_groups():
    hellos = [{"rank": 0, "torch": "2.4", "python": "3.11"}, {"rank": 1, "torch": "2.3", "python": "3.11"},
              {"rank": 2, "torch": "2.4", "python": "3.11"}]
    assert audit.version_groups(hellos) == {"torch": {"2.4": [0, 2], "2.3": [1]}}


def test_measure_node_reads_this_machine():
    facts = audit.measure_node()
    assert facts["cpus"] >= 1 and len(facts["nofile"]) == 2


# ----------------------------------------------------------------------------- diagnosis
def _snapshot(world=3, **extra):
    data = {"master": None}
    for r in range(world):
        data[f"started/{r}"] = {"rank": r, "pid": 100 + r, "local_rank": r, "group_rank": 0, "host": "h"}
        data[f"hello/{r}"] = {"rank": r, "host": "h", "torch": "2.13", "python": "3.11", "cuda": None, "nccl": None,
                              "device": "cpu", "backend": "gloo"}
        data[f"res/{r}/rendezvous"] = {"status": "pass", "duration_s": 0.1}
    snap = {"master": {"world_size": world, "group_world_size": 1}, "data": data, "stuck": {}, "killed": []}
    snap.update(extra)
    return snap


def test_diagnose_hung_rank_is_named_with_its_waiters():
    snap = _snapshot()
    d = snap["data"]
    for r in range(3):
        d[f"at/{r}"] = {"test": "ring"}
    d["res/0/ring"] = {"status": "pass", "items": [{"pair": [0, 2], "peer": 2, "ok": True, "status": "pass"}]}
    d["res/1/ring"] = {"status": "timeout", "waiting_for": [2], "detail": "send to rank 2: timed out",
                       "items": [{"pair": [1, 2], "peer": 2, "ok": False, "status": "timeout", "op": "send to rank 2"}]}
    snap["stuck"] = {2: "ring"}
    snap["killed"] = [{"pid": 102, "signal": "SIGTERM"}]
    snap["failures"] = {2: {"pid": 102, "exitcode": -15, "signal": "SIGTERM"}}
    report = check_report(snap, deadline=2.0)
    assert report["verdict"] == "fail" and report["exit_code"] == 1
    errors = [f for f in report["findings"] if f["severity"] == "error"]
    assert [(f["code"], f["ranks"], f["evidence"]["test"]) for f in errors] == [("DDP502", [2], "ring")]
    assert errors[0]["evidence"]["waiting"] == [1] and errors[0]["source"] == "check"
    assert {r["rank"]: r["state"] for r in report["ranks"]} == {0: "ok", 1: "ok", 2: "hung"}
    assert [t["status"] for t in report["tests"]][:3] == ["pass", "fail", "not-run"]


def test_diagnose_version_mismatch_and_rendezvous_failure():
    snap = _snapshot()
    snap["data"]["hello/1"]["torch"] = "2.12"
    del snap["data"]["res/2/rendezvous"]
    snap["data"]["res/2/rendezvous"] = {"status": "error", "detail": "connect refused"}
    report = check_report(snap, deadline=2.0)
    codes = {(f["code"], tuple(f["ranks"])) for f in report["findings"]}
    assert ("DDP508", (0, 1, 2)) in codes and ("DDP501", (2,)) in codes


def test_diagnose_no_rank_came():
    report = check_report({"master": None, "data": {}, "job_error": "RendezvousTimeoutError"}, deadline=1.0)
    assert report["verdict"] == "fail" and report["findings"][0]["code"] == "DDP501"


def test_every_check_code_is_in_the_catalogue():
    for code in ("DDP501", "DDP502", "DDP503", "DDP504", "DDP505", "DDP506", "DDP507", "DDP508", "DDP509"):
        assert code in CATALOGUE


def test_check_report_matches_its_json_schema():
    import jsonschema

    from ddp_doctor.check import CHECK_JSON_SCHEMA

    snap = _snapshot()
    for r in range(3):
        snap["data"][f"res/{r}/ring"] = {"status": "pass", "duration_s": 0.1,
                                         "items": [{"pair": [r, (r + 1) % 3], "peer": 1, "ok": True, "time_s": 0.01}]}
    jsonschema.validate(check_report(snap, deadline=1.0), CHECK_JSON_SCHEMA)
    jsonschema.validate(check_report({"master": None, "data": {}}, deadline=1.0), CHECK_JSON_SCHEMA)


# ----------------------------------------------------------------------------- CLI parsing
def test_cli_splits_its_own_options_from_torchrun_options():
    from ddp_doctor.cli.check import split_argv

    ours, rest = split_argv(["--deadline", "3", "--nproc-per-node", "4", "--report=r.json", "--sizes", "1M",
                             "--rdzv_endpoint", "h:1", "--verbose"])
    assert ours["deadline"] == "3" and ours["report"] == "r.json" and ours["sizes"] == "1M" and ours["verbose"]
    assert rest == ["--nproc-per-node", "4", "--rdzv_endpoint", "h:1"]


@pytest.mark.parametrize("argv", [["--deadline", "0"], ["--deadline"], ["--sizes", "lots"], ["--backend", "mpi"],
                                  ["--nproc-per-node", "2", "train.py"]])
def test_cli_usage_errors_exit_2(argv, capsys):
    from ddp_doctor.cli.check import main

    assert main(argv) == 2
    assert "usage: ddp-doctor check" in capsys.readouterr().err


def test_diagnose_two_ranks_on_one_gpu():
    snap = _snapshot()
    for r, uuid in ((0, "GPU-a"), (1, "GPU-a"), (2, "GPU-b")):
        snap["data"][f"hello/{r}"]["device_uuid"] = uuid
    report = check_report(snap, deadline=1.0)
    assert [(f["code"], f["ranks"]) for f in report["findings"] if f["code"] == "DDP509"] == [("DDP509", [0, 1])]


def test_every_pair_deadline_grows_with_the_number_of_rounds_only_when_needed():
    assert plan.test_deadline("pairs", 10, 4) == 10 and plan.test_deadline("barrier", 10, 64) == 10
    assert plan.test_deadline("pairs", 10, 64) == pytest.approx(0.5 * 63 / 0.9)
    assert plan.test_deadline("pairs", 10, 64, nnodes=2) == 10


# ----------------------------------------------------------------------------- side channel
def test_check_uses_the_signed_store(monkeypatch):
    """check's values go through run's SideChannel: a value written without the job's secret reads as missing."""
    from datetime import timedelta

    import torch.distributed as dist

    from ddp_doctor.channel import SECRET_ENV, SideChannel
    from ddp_doctor.check import channel

    monkeypatch.setenv(SECRET_ENV, "ab" * 32)
    host = channel.host_store(timeout_s=5.0)
    assert isinstance(host, SideChannel) and host.secret
    client = channel.connect("127.0.0.1", host.port, timeout_s=5.0)
    channel.Channel(client).set("res/0/ring", {"status": "pass"})
    assert channel.get(host, "res/0/ring") == {"status": "pass"}
    raw = dist.TCPStore("127.0.0.1", host.port, is_master=False, timeout=timedelta(seconds=5), wait_for_workers=False)
    raw.set("stop", '{"test": "ring"}')  # forged: no signature
    assert channel.get(host, "stop") is None and not channel.wait_for(host, "stop", timeout_s=0.2)
    assert channel.wait_for(host, "res/0/ring", timeout_s=1.0)
