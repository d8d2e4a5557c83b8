"""The report of one run, assembled from the watcher's evidence and diagnose()'s findings.

Builds the ``ddp-doctor/report/v1`` document (DESIGN.md "Contracts"), exchanges it between the nodes of
a multi-node job (one job, one diagnosis), and hands it to :mod:`ddp_doctor.report` to write and print.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from ddp_doctor import channel
from ddp_doctor.diagnose import diagnose
from ddp_doctor.diagnose.live import find_desync
from ddp_doctor.watch import FATAL, stacks


# the ranks-fall-out-of-step family: lint's guess at the cause and the runtime's name for what happened
# may differ (lint DDP201 at a line the runtime calls DDP202/DDP203); other codes confirm only themselves
_STEP_FAMILY = {"DDP101", "DDP201", "DDP202", "DDP203", "DDP204"}


def _same_hazard(lint_code: str, runtime_code: str) -> bool:
    return lint_code == runtime_code or {lint_code, runtime_code} <= _STEP_FAMILY




def build_report(job, job_error, lint_findings, t_end) -> dict[str, Any]:
    w = job.watcher
    decision = w.decision
    if decision is None or (decision.get("reason") == "exit" and not decision.get("finished")):
        # ranks that failed together inside one collective: their final states may show the mismatch
        try:
            late = find_desync(w.views, w.world_size)
        except Exception:
            late = None
        if late is not None:
            decision = {**(decision or {}), **late}
    for r, info in job.failures.items():  # exits the agent reaped before the watcher saw them
        v = w.views.get(r)
        if v is not None and v.state and not v.exit:
            v.exit = info
            if info.get("signal") in FATAL and not v.stack and v.state.get("pid"):
                v.stack = stacks.fatal_stack(w.run_dir, v.state["pid"])
    evidence = w.evidence()
    evidence["lint"] = [{"code": f.code, "path": f.location.path, "line": f.location.line}
                        for f in lint_findings if f.location]
    verdict, findings = diagnose(evidence, decision, job.failures)
    exit_code = 0
    if verdict == "crash":
        # the root rank's own exit status (as a shell shows it: 128+N for a signal)
        root = findings[0].ranks[0] if findings and findings[0].ranks else None
        code = (job.failures.get(root) or (evidence["ranks"].get(root) or {}).get("exit") or {}).get("exit_code")
        if not code:
            code = next((c for c in (f.get("exit_code") for f in job.failures.values()) if c), 1)
        exit_code = 128 - code if code < 0 else code
    elif verdict != "ok":
        exit_code = 1
    elif job_error is not None:
        exit_code = 1
    runtime = [f.to_report_dict() | {"source": "runtime"} for f in findings]
    lint = [f.to_report_dict() | {"source": "lint"} for f in lint_findings]
    for rf in runtime:
        loc = rf.get("location")
        if not loc:
            continue
        for lf in lint:
            ll = lf.get("location") or {}
            if ll.get("line") == loc.get("line") and os.path.basename(ll.get("path", "")) == os.path.basename(loc["path"]) \
                    and _same_hazard(lf["code"], rf["code"]):
                lf["severity"] = "error"
                lf["confirmed_by_runtime"] = rf["code"]
                rf["evidence"]["lint"] = {"code": lf["code"], "message": lf["message"]}
                rf["message"] += (f" ddp-doctor lint flagged this line before the run ({lf['code']}): "
                                  "the static warning came true.")
                break
    report: dict[str, Any] = {
        "schema": "ddp-doctor/report/v1",
        "verdict": verdict,
        "exit_code": exit_code,
        "world_size": w.world_size,
        "findings": runtime,
        "ranks": [rank_entry(r, st, job.failures) for r, st in sorted(evidence["ranks"].items())],
        "command": ["ddp-doctor", "run", *job.argv],
        "started_at": job.started_at,
        "duration_s": round(time.time() - job.t0, 3),
        "hang_timeout_s": evidence.get("hang_limit_s"),
        "nnodes": str(job.args.nnodes),
        "lint": {"path": job.args.training_script, "findings": lint},
    }
    if decision is not None:
        t_detect = decision.get("t_detect")
        stats = {"reason": decision.get("reason"), "limit": evidence.get("hang_limit_how")}
        if t_detect and decision.get("stalled_s") is not None:
            stats["stalled_s_at_detection"] = decision["stalled_s"]
        if t_detect:
            stats["detect_to_stacks_s"] = round(decision["t_stacks"] - t_detect, 3)
            stats["detect_to_stopped_s"] = round(t_end - t_detect, 3)
        report["detection"] = stats
    if getattr(w, "earlier", None):
        report["attempt"] = w.attempt
        report["restarts"] = [earlier_attempt(job, e, evidence["lint"]) for e in w.earlier]
    if job.leftovers:
        report["leftover_pids"] = job.leftovers
    return report

def earlier_attempt(job, earlier: dict[str, Any], lint: list[dict]) -> dict[str, Any]:
    """The diagnosis of an attempt torch's agent restarted after a failure (``--max-restarts``)."""
    evidence = {**earlier["evidence"], "lint": lint}
    verdict, findings = diagnose(evidence, earlier["decision"], {})
    return {"attempt": earlier["attempt"], "verdict": verdict,
            "findings": [f.to_report_dict() | {"source": "runtime"} for f in findings],
            "ranks": [rank_entry(r, st, {}) for r, st in sorted(evidence["ranks"].items())]}

def rank_entry(r: int, st: dict[str, Any], failures: dict[int, dict]) -> dict[str, Any]:
    ex = st.get("exit") or failures.get(r) or {}
    stack = st.get("stack") or []
    if not stack and st.get("exc"):
        stack = st["exc"].get("traceback") or []
    if st.get("missing"):
        state = "missing"
    elif st.get("exc"):
        state = "crashed"
    elif ex.get("signal") and ex.get("signal") != "SIGTERM":
        state = "killed"
    elif st.get("done"):
        state = "finished"
    elif st.get("in_collective"):
        state = "in_collective"
    elif st.get("in_data_wait"):
        state = "data_wait"
    elif ex:
        state = "stopped" if ex.get("signal") == "SIGTERM" else "exited"
    else:
        state = "running"
    entry = {
        "rank": r, "state": state, "epoch": st.get("epoch"), "step": st.get("step"),
        "last_collective": st.get("in_collective") or st.get("last_collective"),
        "stack": stack, "exit_code": ex.get("exit_code", st.get("exit_code")),
        "signal": ex.get("signal"),
    }
    for k in ("host", "pid", "local_rank", "timing", "timeline", "workers", "exc", "where", "forwards",
              "steps_by_epoch", "loaders", "ddp"):
        if st.get(k) is not None:
            entry[k] = st[k]
    return entry

def emit(job, report: dict[str, Any], is_host: bool) -> int:
    from ddp_doctor.report import write_json

    if not is_host and job.store is not None:
        # one job, one diagnosis: take the hosting node's report (it names global ranks)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                if job.store.check([channel.REPORT]):
                    report = json.loads(job.store.get(channel.REPORT))
                    job.store.add(channel.REPORT_READ, 1)
                    break
            except Exception:
                break
            time.sleep(0.2)
    elif job.store is not None and job.own:
        try:
            job.store.set(channel.REPORT, json.dumps(report))
            followers = job.nnodes - 1
            end = time.monotonic() + (10 if followers > 0 else 0)
            while followers > 0 and time.monotonic() < end and job.store.add(channel.REPORT_READ, 0) < followers:
                time.sleep(0.2)
        except Exception:
            pass
    try:
        from ddp_doctor.report.snippets import attach_snippets

        report = attach_snippets(report)
    except Exception:
        pass
    if job.own.get("--report"):
        write_json(report, job.own["--report"])
    if job.own.get("--html"):
        try:
            from ddp_doctor.report.html import write_html

            write_html(report, job.own["--html"])
        except ImportError:
            print("ddp-doctor: HTML report not available in this build", file=sys.stderr)
    if not job.own.get("--quiet"):
        print_text(report)
    return int(report["exit_code"])




def live_rows(watcher) -> list[dict[str, Any]]:
    """LiveView rows from the watcher's latest states (plain data; the view formats)."""
    rows = []
    for r, v in sorted(watcher.views.items()):
        st = v.state or {}
        times = st.get("step_times") or []
        tm = st.get("timing") or {}
        c = st.get("in_collective")
        w = (c or {}).get("site") or st.get("where") or {}
        rows.append({
            "rank": r,
            "state": ("finished" if st.get("done") else "in " + c["op"] if c else
                      "data wait" if st.get("in_data_wait") else "running" if st else "starting"),
            "epoch": st.get("epoch"), "step": st.get("step"),
            "steps_per_s": round(len(times[-20:]) / sum(times[-20:]), 2) if times and sum(times[-20:]) > 0 else None,
            "data_wait_pct": round(100 * tm["data_wait_s"] / tm["step_time_s"], 1) if tm.get("step_time_s") else None,
            "where": f"{os.path.basename(w['path'])}:{w['line']}" if w.get("path") else "",
        })
    return rows


def print_text(report: dict[str, Any]) -> None:
    try:
        from ddp_doctor.report.terminal import print_report
    except ImportError:
        print_report = None
    if print_report is not None:
        print_report(report, file=sys.stderr)
        return
    # stop-gap until ddp_doctor.report.terminal lands
    print(f"ddp-doctor: verdict {report['verdict']} (exit {report['exit_code']})", file=sys.stderr)
    for f in report["findings"]:
        loc = f.get("location") or {}
        print(f"  {f['code']} {f['severity']} ranks {f['ranks']} {loc.get('path')}:{loc.get('line')}\n"
              f"    {f['message']}\n    fix: {f['fix']}", file=sys.stderr)


