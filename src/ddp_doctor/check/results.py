"""Turn what the ranks published (a :class:`~.monitor.Monitor` snapshot) into the check report.

The report is a dict in the style of DESIGN.md (schema ``ddp-doctor/check/v1``): findings
with DDP5xx codes (``"source": "check"``), ranks, and per-test results with per-rank and
per-pair outcomes, the all_reduce bandwidth table and every node's environment audit.
No formatting here: :mod:`ddp_doctor.report.check_view` renders it.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.check import CHECK_SCHEMA_ID, audit, plan
from ddp_doctor.findings import Finding, Severity, runtime_fix
from ddp_doctor.report.ranks import RankWord, rank_entry

BROKEN = ("timeout", "error")


def _ranks_str(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)


def _finding(code: str, message: str, fix: str, ranks, test: str | None, severity: str | None = None,
             **evidence) -> Finding:
    if test is not None:
        evidence = {"test": test, **evidence}
    return Finding(code, message, fix, ranks=sorted(set(ranks)), evidence=evidence, severity=severity)


def bandwidth_table(results: dict[int, dict[str, Any]], world_size: int) -> list[dict[str, Any]]:
    """all_reduce per size: slowest rank's time per op, algbw and busbw (nccl-tests formula)."""
    by_size: dict[int, list[dict[str, Any]]] = {}
    for res in results.values():
        for item in res.get("items", []):
            by_size.setdefault(int(item["bytes"]), []).append(item)
    rows = []
    for nbytes in sorted(by_size):
        items = by_size[nbytes]
        t = max(i["time_s"] for i in items)
        rows.append({"bytes": nbytes, "ranks": len(items), "time_s": t,
                     "algbw_GBps": plan.algbw(nbytes, t) / 1e9,
                     "busbw_GBps": plan.busbw("all_reduce", nbytes, t, world_size) / 1e9,
                     "ok": all(i.get("ok") for i in items)})
    return rows


def check_report(snapshot: dict[str, Any], *, deadline: float, nnodes_hint: int = 1,
                 expected_world: int | None = None) -> dict[str, Any]:
    """The check/v1 document of a monitor snapshot: the rendezvous, the ranks that exited, each test's outcome,
    the environment, each rank; findings sorted gravest first, the verdict ``fail`` on any error."""
    data = snapshot.get("data", {})
    master = snapshot.get("master") or {}
    world = int(master.get("world_size") or expected_world or 0)
    nnodes = int(master.get("group_world_size") or nnodes_hint)
    failures: dict[int, dict[str, Any]] = {int(k): v for k, v in (snapshot.get("failures") or {}).items()}
    stuck: dict[int, str] = {int(k): v for k, v in (snapshot.get("stuck") or {}).items()}
    killed_pids = {k["pid"] for k in snapshot.get("killed", [])}
    exited = _exited_on_their_own(data, failures, stuck, killed_pids)
    findings, culprits = _rendezvous_findings(data, world, exited, stuck, snapshot.get("job_error"))
    findings += _exit_findings(exited, culprits)
    tests_out = _test_results(data, world, exited, stuck, culprits, deadline, findings)
    audits = [data[k] for k in sorted(data) if k.startswith("audit/")]
    findings += _environment_findings(data, world, audits)
    ranks_out = _rank_entries(data, world, failures, exited, stuck, culprits)
    findings.sort(key=lambda f: (-f.severity.rank, f.code, f.ranks))
    failed_tests = [t["name"] for t in tests_out if t["status"] == "fail"]
    errors = [f for f in findings if f.severity is Severity.ERROR]
    incomplete = [t["name"] for t in tests_out if t["status"] not in ("pass", "skip")]
    verdict = "fail" if (errors or failed_tests or incomplete or world == 0) else "ok"
    out_findings = []
    for f in findings:
        d = f.to_report_dict()
        d["source"] = "check"
        out_findings.append(d)
    return {
        "schema": CHECK_SCHEMA_ID, "verdict": verdict, "exit_code": 1 if verdict == "fail" else 0,
        "world_size": world, "nnodes": nnodes, "deadline_s": deadline,
        "findings": out_findings, "ranks": ranks_out, "tests": tests_out,
        "bandwidth": next((t.get("bandwidth", []) for t in tests_out if t["name"] == "all_reduce"), []),
        "audit": audits, "job_error": snapshot.get("job_error"),
    }


def _result(data: dict[str, Any], r: int, test: str) -> dict[str, Any] | None:
    return data.get(f"res/{r}/{test}")


def _at(data: dict[str, Any], r: int) -> str | None:
    """The test rank ``r`` was in last."""
    value = data.get(f"at/{r}")
    return value["test"] if value else None


def _exited_on_their_own(data: dict[str, Any], failures: dict[int, dict[str, Any]], stuck: dict[int, str],
                         killed_pids: set) -> dict[int, dict[str, Any]]:
    """Ranks that exited on their own (not stopped by the agent or by us), with the test they were in."""
    exited: dict[int, dict[str, Any]] = {}
    for r, f in failures.items():
        pid = f.get("pid")
        sig = f.get("signal")
        if pid in killed_pids:
            continue
        if (f.get("exitcode") or 0) > 0 or (sig and sig not in ("SIGTERM",)):
            exited[r] = {**f, "test": _at(data, r) or "rendezvous"}
    if not exited and failures and not stuck:
        # everyone was stopped by the agent: the first failure is the root cause
        first = min(failures.items(), key=lambda kv: kv[1].get("timestamp", 0))
        exited[first[0]] = {**first[1], "test": _at(data, first[0]) or "rendezvous"}
    return exited


def _rendezvous_findings(data: dict[str, Any], world: int, exited: dict[int, dict[str, Any]], stuck: dict[int, str],
                         job_error: Any) -> tuple[list[Finding], set[int]]:
    """DDP501: no rank joined, or ranks that did not join the process group (the culprits so far)."""
    findings: list[Finding] = []
    if world == 0:
        findings.append(_finding(
            "DDP501", "No rank joined: the rendezvous did not complete"
            + (f" ({job_error})" if job_error else ""),
            runtime_fix("DDP501.no-rank"),
            [], "rendezvous", error=job_error))
    culprits: set[int] = set()
    for r in range(world):
        rr = _result(data, r, "rendezvous")
        if rr and rr.get("status") == "pass":
            continue
        if r in exited and exited[r]["test"] == "rendezvous":
            continue  # reported as an exit below
        if exited and r not in stuck:
            continue  # stopped by the launcher because another rank exited: a victim, not a cause
        culprits.add(r)
        started = data.get(f"started/{r}")
        what = (f"init_process_group failed: {rr['detail']}" if rr else
                f"no answer within the deadline ({stuck.get(r, 'rendezvous')})" if started else "never started")
        findings.append(_finding(
            "DDP501", f"Rank {r} did not join the process group: {what}",
            runtime_fix("DDP501.not-joined"),
            [r], "rendezvous", host=(started or {}).get("host"), detail=(rr or {}).get("detail")))
    return findings, culprits


def _exit_findings(exited: dict[int, dict[str, Any]], culprits: set[int]) -> list[Finding]:
    """A rank that exited during a test (DDP501 in the rendezvous, else DDP204); each is a culprit."""
    findings: list[Finding] = []
    for r, f in sorted(exited.items()):
        culprits.add(r)
        how = f"was killed by {f['signal']}" if f.get("signal") and (f.get("exitcode") or 0) <= 0 else \
            f"exited with code {f.get('exitcode')}"
        code = "DDP501" if f["test"] == "rendezvous" else "DDP204"
        findings.append(_finding(
            code, f"Rank {r} {how} during '{f['test']}'; the launcher stopped the job",
            runtime_fix("DDP204.check-exit"),
            [r], f["test"], exit_code=f.get("exitcode"), signal=f.get("signal"), log_tail=f.get("log_tail")))
    return findings


def _test_results(data: dict[str, Any], world: int, exited: dict[int, dict[str, Any]], stuck: dict[int, str],
                  culprits: set[int], deadline: float, findings: list[Finding]) -> list[dict[str, Any]]:
    """Each test's per-rank (and per-pair) outcome; its findings appended to ``findings``."""
    tests_out = []
    for test in plan.ALL_TESTS:
        per_rank = []
        for r in range(world):
            rr = _result(data, r, test)
            if rr is not None:
                entry = {"rank": r, **{k: rr.get(k) for k in ("status", "duration_s", "detail", "waiting_for")}}
            elif stuck.get(r) == test:
                entry = {"rank": r, "status": "hung", "duration_s": None,
                         "detail": f"no result within {deadline:g} s (+ grace); stopped by ddp-doctor"}
            elif r in exited and exited[r]["test"] == test:
                sig = f" ({exited[r]['signal']})" if exited[r].get("signal") else ""
                entry = {"rank": r, "status": "exited", "duration_s": None,
                         "detail": f"exit code {exited[r].get('exitcode')}{sig}"}
            else:
                entry = {"rank": r, "status": "not-run", "duration_s": None, "detail": ""}
            per_rank.append(entry)
        statuses = {e["status"] for e in per_rank}
        if not statuses:
            status = "not-run"
        elif statuses <= {"pass", "skip"}:
            status = "skip" if statuses == {"skip"} else "pass"
        elif statuses == {"not-run"}:
            status = "not-run"
        else:
            status = "fail"
        entry: dict[str, Any] = {"name": test, "status": status, "ranks": per_rank,
                                 "duration_s": max((e["duration_s"] or 0 for e in per_rank), default=0)}
        if test in plan.P2P_TESTS:
            entry["pairs"] = _pairs(world, test, data)
        if test == "all_reduce":
            results = {r: rr for r in range(world) if (rr := _result(data, r, test)) and rr.get("items")}
            entry["bandwidth"] = bandwidth_table(results, world)
        if test == "broadcast":
            entry["sources"] = _sources(world, data)
        tests_out.append(entry)
        if test != "rendezvous":
            findings.extend(_test_findings(test, per_rank, entry.get("pairs"), stuck, culprits, deadline))
    return tests_out


def _environment_findings(data: dict[str, Any], world: int, audits: list[dict[str, Any]]) -> list[Finding]:
    """Every node's environment audit merged per check, versions that differ across ranks, a GPU shared."""
    findings: list[Finding] = []
    by_key: dict[tuple[str, str], dict[str, Any]] = {}
    for node in audits:
        for check in node.get("checks", []):
            if not check.get("code"):
                continue
            key = (check["code"], check["check"])
            merged = by_key.setdefault(key, {**check, "nodes": []})
            merged["nodes"].append({"node": node["node"], "host": node.get("host"), "value": check["value"]})
    for (code, name), check in by_key.items():
        node_ranks = [r for r in range(world) if data.get(f"started/{r}", {}).get("group_rank") in
                      {n["node"] for n in check["nodes"]}]
        where = ", ".join(f"node {n['node']} ({n['host']})" for n in check["nodes"])
        findings.append(_finding(code, f"{name} = {check['value']} on {where}: {check['detail']}", check.get("fix", ""),
                                 node_ranks, None, check.get("severity"), check=name, nodes=check["nodes"]))
    hellos = [data[f"hello/{r}"] for r in range(world) if f"hello/{r}" in data]
    for key, groups in audit.version_groups(hellos).items():
        desc = "; ".join(f"{key} {value} on {_ranks_str(ranks)}" for value, ranks in groups.items())
        findings.append(_finding("DDP508", f"{key} versions differ across ranks: {desc}",
                                 runtime_fix("DDP508"),
                                 [r for ranks in groups.values() for r in ranks], None, key=key, groups=groups))

    # two ranks on one physical GPU (same host, same device UUID)
    by_device: dict[tuple[str, str], list[int]] = {}
    for h in hellos:
        if h.get("device_uuid"):
            by_device.setdefault((h.get("host"), h["device_uuid"]), []).append(int(h["rank"]))
    for (host, uuid), ranks in sorted(by_device.items()):
        if len(ranks) > 1:
            findings.append(_finding(
                "DDP509", f"{_ranks_str(ranks)} on {host} use the same GPU ({uuid})",
                runtime_fix("DDP509"), ranks, None, host=host, device_uuid=uuid))
    return findings


def _rank_entries(data: dict[str, Any], world: int, failures: dict[int, dict[str, Any]],
                  exited: dict[int, dict[str, Any]], stuck: dict[int, str], culprits: set[int]) -> list[dict[str, Any]]:
    """The check/v1 entry of each rank (``report.ranks.rank_entry``)."""
    ranks_out = []
    for r in range(world):
        hello = data.get(f"hello/{r}") or {}
        started = data.get(f"started/{r}") or {}
        f = failures.get(r, {})
        state = (RankWord.EXITED if r in exited else RankWord.HUNG if r in stuck else RankWord.NOT_STARTED
                 if not started else RankWord.FAILED if r in culprits else RankWord.OK)
        ranks_out.append(rank_entry(
            r, state, exit_code=f.get("exitcode"), signal=f.get("signal"),
            host=hello.get("host") or started.get("host"), pid=hello.get("pid") or started.get("pid"),
            local_rank=started.get("local_rank"), node=started.get("group_rank"),
            device=hello.get("device"), device_name=hello.get("device_name"), backend=hello.get("backend"),
            versions={k: hello.get(k) for k in ("python", "torch", "cuda", "nccl")} if hello else {},
            last_test=_at(data, r), log_tail=f.get("log_tail"),
        ))
    return ranks_out


def _pairs(world: int, test: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per pair tested (from both ends): pass only when both ends passed."""
    pairs: dict[tuple[int, int], dict[str, Any]] = {}
    for r in range(world):
        rr = data.get(f"res/{r}/{test}") or {}
        for item in rr.get("items", []):
            a, b = item["pair"]
            row = pairs.setdefault((a, b), {"pair": [a, b], "ok": True, "time_s": 0.0, "details": [], "seen_by": []})
            row["seen_by"].append(r)
            row["time_s"] = max(row["time_s"], item.get("time_s") or 0.0)
            if not item.get("ok"):
                row["ok"] = False
                wrong = item.get("wrong")
                what = item.get("error") or (f"element {wrong['index']} is {wrong['got']:g}, expected {wrong['expected']:g}"
                                             if wrong else "")
                row["details"].append(f"rank {r}: {item.get('op')}: {what}")
                row.setdefault("statuses", set()).add(item.get("status"))
    rows = []
    for (a, b), row in sorted(pairs.items()):
        statuses = row.pop("statuses", set())
        row["status"] = ("pass" if row["ok"] else "timeout" if "timeout" in statuses
                         else "error" if "error" in statuses else "fail")
        rows.append(row)
    return rows


def _sources(world: int, data: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for src in range(world):
        bad = []
        for r in range(world):
            for item in (data.get(f"res/{r}/broadcast") or {}).get("items", []):
                if item["src"] == src and not item["ok"]:
                    bad.append(r)
        rows.append({"src": src, "ok": not bad, "wrong_on": bad})
    return rows


def _test_findings(test: str, per_rank: list[dict[str, Any]], pairs, stuck: dict[int, str],
                   culprits: set[int], deadline: float) -> list[Finding]:
    out: list[Finding] = []
    hung = [e["rank"] for e in per_rank if e["status"] == "hung"]
    broken = [e for e in per_rank if e["status"] in BROKEN]
    wrong = [e for e in per_rank if e["status"] == "fail"]
    waiting_on = {e["rank"]: e.get("waiting_for") or [] for e in broken}
    for r in hung:
        culprits.add(r)
        waiters = sorted(w for w, peers in waiting_on.items() if r in peers)
        msg = f"Rank {r} stopped answering in '{test}': no result within {deadline:g} s"
        if waiters:
            msg += f" ({_ranks_str(waiters)} timed out waiting for it)"
        out.append(_finding("DDP502", msg,
                            runtime_fix("DDP502.hung"),
                            [r], test, waiting=waiters, kind="hung"))
    explained = set(culprits)
    if pairs is not None:
        for row in pairs:
            if row["ok"] or explained & set(row["pair"]):
                continue
            a, b = row["pair"]
            if row["status"] == "fail":   # data arrived, but wrong
                out.append(_finding("DDP503", f"Link {a} <-> {b} delivered wrong data in '{test}': "
                                    + "; ".join(row["details"]),
                                    runtime_fix("DDP503.pair"),
                                    [a, b], test, pair=[a, b]))
                explained |= {a, b}
                continue
            out.append(_finding("DDP502", f"Link {a} <-> {b} failed in '{test}': " + "; ".join(row["details"]),
                                runtime_fix("DDP502.pair"),
                                [a, b], test, pair=[a, b], kind="pair"))
            explained |= {a, b}
        others = [e for e in broken if e["rank"] not in explained and not set(e.get("waiting_for") or []) & explained]
    else:
        others = [e for e in broken if e["rank"] not in explained and not set(e.get("waiting_for") or []) & explained]
        if broken and culprits:
            others = []  # a collective breaks everywhere once one rank is gone: the culprit finding says it
    if others:
        ranks = [e["rank"] for e in others]
        detail = "; ".join(f"rank {e['rank']}: {e['detail']}" for e in others[:4])
        out.append(_finding("DDP502", f"'{test}' failed on {_ranks_str(ranks)}: {detail}",
                            runtime_fix("DDP502.collective"),
                            ranks, test, kind="collective"))
    if wrong and pairs is None:
        ranks = [e["rank"] for e in wrong]
        detail = "; ".join(f"rank {e['rank']}: {e['detail']}" for e in wrong[:4])
        out.append(_finding("DDP503", f"'{test}' delivered wrong data to {_ranks_str(ranks)}: {detail}",
                            runtime_fix("DDP503"),
                            ranks, test))
    return out
