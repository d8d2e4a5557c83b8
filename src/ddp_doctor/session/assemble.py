"""The report of one run, assembled from the watcher's evidence and diagnose()'s findings.

Builds the ``ddp-doctor/report/v1`` document (DESIGN.md "Contracts"), exchanges it between the nodes of
a multi-node job (one job, one diagnosis), and hands it to :mod:`ddp_doctor.report` to write and print.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from typing import Any

from ddp_doctor import store as side
from ddp_doctor.diagnose import diagnose_guarded
from ddp_doctor.diagnose.blame import lint_mark
from ddp_doctor.evidence import EVIDENCE_OUT_ENV, Capture, ExitStatus, JobEvidence, LintMark, RankState, Verdict
from ddp_doctor.findings import plain, severity_rank
from ddp_doctor.report import report_v1
from ddp_doctor.report.ranks import RankWord, rank_entry
from ddp_doctor.report.facts import contradictions


def run_report(job, job_error, lint_findings, t_end) -> dict[str, Any]:
    w = job.watcher
    decision = w.settle(job.failures)
    marks = tuple(lint_mark(f) for f in lint_findings if f.location)
    evidence = w.evidence().with_(lint=marks)
    save_evidence(evidence, decision, job.failures)
    lost = {r for n in evidence.lost_nodes for r in n.ranks}
    verdict, findings, failed_diagnosis = diagnose_guarded(evidence, decision, job.failures)
    if failed_diagnosis:
        print(f"ddp-doctor: the diagnosis failed ({failed_diagnosis}); the report keeps the verdict and every "
              "rank's state", file=sys.stderr)
    exit_code = 0
    if verdict == "crash":
        exit_code = crash_exit_code(job, evidence, findings)
    elif verdict != "ok":
        exit_code = 1
    elif job_error is not None:
        exit_code = 1
    if getattr(job, "interrupted", None) is not None:
        # stopped by the user or the scheduler: every rank's stack, no finding that blames the user's code
        verdict, findings, exit_code = "interrupted", [], 128 + int(job.interrupted)
    runtime = [f.to_report_dict() | {"source": "runtime"} for f in findings]
    lint = [f.to_report_dict() | {"source": "lint"} for f in lint_findings]
    confirm_lint(runtime, lint)
    ranks = stall_bands([state_entry(r, st, job.failures, lost) for r, st in sorted(evidence.ranks.items())],
                        evidence, t_end=time.time() - job.t0)
    report = report_v1(
        verdict, w.world_size, runtime, ranks,
        exit_code=exit_code,
        command=["ddp-doctor", "run", *job.argv],
        launcher="ddp-doctor run",
        started_at=job.started_at,
        duration_s=round(time.time() - job.t0, 3),
        hang_timeout_s=evidence.hang_limit_s,
        nnodes=str(job.args.nnodes),
        lint={"path": job.args.training_script, "findings": lint},
    )
    if decision is not None:
        t_detect = decision.t_detect
        stats = {"reason": decision.reason, "limit": evidence.hang_limit_how,
                 **({"kind": decision.kind} if decision.kind else {}),
                 **({"why": decision.limit_how} if decision.reason == "hang" and decision.limit_how else {})}
        if t_detect and decision.stalled_s is not None:
            stats["stalled_s_at_detection"] = decision.stalled_s
        if t_detect:
            stats["detect_to_stacks_s"] = round(decision.t_stacks - t_detect, 3)
            stats["detect_to_stopped_s"] = round(t_end - t_detect, 3)
        report["detection"] = stats
    if getattr(w, "earlier", None):
        report["attempt"] = w.attempt
        report["restarts"] = [earlier_attempt(e, marks) for e in w.earlier]
    if failed_diagnosis:
        report["diagnosis_error"] = failed_diagnosis
    if job.leftovers:
        report["leftover_pids"] = job.leftovers
    report["sources"] = job_sources(evidence, job.args.training_script)
    # each sentence checked against the facts this report records (zero is the release bar: report/facts.py)
    report["contradictions"] = [c.to_json() for c in contradictions(report)]
    side_channel = side_channel_section(job, evidence)
    if side_channel is not None:
        report["side_channel"] = side_channel
    return report


def stall_report(job, decision: Verdict) -> dict[str, Any]:
    """The report written at a stall, while the job still runs: verdict ``stalled``, the diagnosis of where
    every rank is and what the stuck ones are blocked on, ``exit_code`` null (the job has none yet).  The
    report at the end of the job replaces it."""
    w = job.watcher
    marks = tuple(lint_mark(f) for f in job.lint_findings if f.location)
    evidence = w.evidence().with_(lint=marks)
    _verdict, findings, failed_diagnosis = diagnose_guarded(evidence, decision, {})
    lost = {r for n in evidence.lost_nodes for r in n.ranks}
    report = report_v1(
        "stalled", w.world_size, [f.to_report_dict() | {"source": "runtime"} for f in findings],
        stall_bands([state_entry(r, st, {}, lost) for r, st in sorted(evidence.ranks.items())], evidence,
                    t_end=time.time() - job.t0),
        exit_code=None, command=["ddp-doctor", "run", *job.argv], launcher="ddp-doctor run",
        started_at=job.started_at, duration_s=round(time.time() - job.t0, 3), hang_timeout_s=evidence.hang_limit_s,
        nnodes=str(job.args.nnodes),
        detection={"reason": "stalled", "limit": evidence.hang_limit_how, "stalled_s_at_detection": decision.stalled_s,
                   "detect_to_stacks_s": round((decision.t_stacks or 0.0) - (decision.t_detect or 0.0), 3)})
    report["exit_code"] = None  # (report_v1 fills in 1 for a verdict that is not ok)
    if failed_diagnosis:
        report["diagnosis_error"] = failed_diagnosis
    report["sources"] = job_sources(evidence, job.args.training_script)
    return report


def stall_bands(ranks: list[dict[str, Any]], evidence: JobEvidence, t_end: float) -> list[dict[str, Any]]:
    """Each stall as a span of its stuck ranks' timelines (kind ``stall``, from its start for as long as it
    lasted, or to ``t_end``): the HTML timeline draws it as a band with its cause."""
    from ddp_doctor.diagnose.common import blocked_words

    by_rank = {e["rank"]: e for e in ranks}
    for s in evidence.stalls:
        if s.t is None:
            continue
        dur = s.lasted_s if s.lasted_s is not None else max(0.0, t_end - s.t)
        for r in s.where:
            e = by_rank.get(r)
            if e is None:
                continue
            o = s.outside.get(r)
            label = "stalled" + (f": {blocked_words(o)}" if o is not None else "")
            e["timeline"] = [*(e.get("timeline") or []), {"t": s.t, "kind": "stall", "dur": round(dur, 3), "label": label}]
    return ranks


def job_sources(evidence: JobEvidence, script: str | None) -> list[str]:
    """Every source file the job's ranks were seen running (sites, stacks, tracebacks, loaders, models),
    plus the script: the only files a snippet may quote (``report.snippets``), never a path that is
    merely written in a report."""
    paths: set[str] = set()
    todo: list[Any] = [st.to_json() for st in evidence.ranks.values()]
    while todo:
        o = todo.pop()
        if isinstance(o, dict):
            if isinstance(o.get("path"), str) and "line" in o:
                paths.add(o["path"])
            todo.extend(o.values())
        elif isinstance(o, (list, tuple)):
            if len(o) >= 3 and isinstance(o[0], str) and isinstance(o[1], int) and o[0].endswith(".py"):
                paths.add(o[0])  # a site table entry [path, line, function]
            todo.extend(o)
    if script and not script.startswith("-") and os.path.isfile(script):
        paths.add(os.path.abspath(script))
    return sorted(p for p in paths if os.path.isabs(p))


def crash_exit_code(job, evidence: JobEvidence, findings) -> int:
    """The job's own exit code, as a shell shows it (128+N for a signal): the code every failing rank
    agrees on (schedulers requeue on it), else the root-cause rank's, else 1.  A rank's program's own
    exit code (``sys.exit(3)``, as the probe saw the program end) beats the process's: a signal after it
    is torch tearing the process group down (gloo's abort at exit), not how the program ended."""
    def code_of(r: int) -> int | None:
        st = evidence.ranks.get(r)
        c = st.exit_code if st is not None else None
        if c is None:
            ex = job.failures.get(r) or (st.exit if st else None)
            c = ex.exit_code if ex else None
        return None if c is None else (128 - c if c < 0 else c)

    failing = {c for c in (code_of(r) for r in set(evidence.ranks) | set(job.failures)) if c}
    if len(failing) == 1:
        return failing.pop()
    root = findings[0].ranks[0] if findings and findings[0].ranks else None
    return (code_of(root) if root is not None else None) or next(iter(sorted(failing)), 1)


def side_channel_section(job, evidence: JobEvidence | None = None) -> dict[str, Any] | None:
    """Was the side channel signed, what did it drop or refuse, and which ranks/nodes went unwatched."""
    channel = job.store if job.store is not None else getattr(job.watcher, "store", None)
    stats = getattr(channel, "stats", None)
    if stats is None:
        return None
    out = stats.to_dict()
    local = getattr(getattr(job, "local", None), "stats", None)
    if local is not None:  # several nodes: what this node's own store (its ranks' states) refused too
        for key, by in local.rejected_by_key.items():
            for reason, n in by.items():
                mine = out["rejected_by_key"].setdefault(key, {})
                mine[reason] = mine.get(reason, 0) + n
        out["dropped"] += local.dropped
    _count_refused_by_ranks(out, evidence)
    try:
        from torch.distributed import run as torchrun

        local_ws = max(1, int(torchrun.determine_local_world_size(job.args.nproc_per_node)))
    except Exception:
        local_ws = 1
    if out.get("lost_at") is not None:
        # the host's channel was dropped by its own server and could not be renewed: every rank unwatched from then
        out["unwatched_ranks"] = sorted(evidence.ranks if evidence is not None else job.watcher.views)
        out["unwatched_nodes"] = []
        return out
    if out["lost"]:
        # this node never reached the side channel: its own ranks went unwatched (their global
        # numbers are the rendezvous's to give, unknown here)
        out["unwatched_ranks"] = []
        out["unwatched_nodes"] = [f"node-rank {int(getattr(job.args, 'node_rank', 0) or 0)} (this node)"]
        return out
    if evidence is not None:
        ranks = [r for r, st in sorted(evidence.ranks.items()) if st.missing]
    else:
        ranks = [r for r, v in sorted(job.watcher.views.items()) if v.state is None]
    out["unwatched_ranks"] = ranks
    out["unwatched_nodes"] = [f"node {n} (ranks {', '.join(str(r) for r in ranks if r // local_ws == n)})"
                              for n in sorted({r // local_ws for r in ranks})]
    lost = evidence.lost_nodes if evidence is not None else ()
    if lost:  # several nodes: an agent the root stopped hearing from; its ranks went unwatched from then on
        out["lost_nodes"] = [n.to_json() for n in lost]
        out["unwatched_nodes"] += [f"node {n.node} on {n.host} (ranks {', '.join(map(str, n.ranks))}): its agent "
                                   f"went silent" for n in lost]
    return out


def _count_refused_by_ranks(out: dict[str, Any], evidence: JobEvidence | None) -> None:
    """Every refused value counted by key: the launcher's own refusals plus those the ranks reported (a forged
    ``ddpd/stop`` is read by the ranks only).  Ranks reading the same key see the same values, so a key's
    count is the most any one reader refused there; ``rejected`` (by reason) and ``rejected_keys`` follow."""
    by_key = out["rejected_by_key"]
    for st in (evidence.ranks.values() if evidence is not None else ()):
        for r in st.refused:
            mine = by_key.setdefault(r.key, {})
            mine[r.reason] = max(mine.get(r.reason, 0), r.count)
    reasons: dict[str, int] = {}
    for by in by_key.values():
        for reason, n in by.items():
            reasons[reason] = reasons.get(reason, 0) + n
    out["rejected"] = reasons
    out["rejected_keys"] = list(by_key)[:20]


def save_evidence(evidence: JobEvidence, decision: Verdict | None, failures: dict[int, ExitStatus]) -> None:
    """``DDP_DOCTOR_EVIDENCE_OUT=PATH``: keep what diagnose() saw, to replay a diagnosis offline (a bug
    report, the golden tests of the finding texts).  Never fails the run."""
    from ddp_doctor.atomic import write_atomic

    path = os.environ.get(EVIDENCE_OUT_ENV)
    if not path:
        return
    try:
        write_atomic(path, json.dumps(Capture(evidence, decision, failures).to_json(), default=str))
    except OSError as e:
        print(f"ddp-doctor: could not save the evidence to {path}: {e}", file=sys.stderr)


def confirm_lint(runtime: list[dict[str, Any]], lint: list[dict[str, Any]]) -> None:
    """The lint finding a runtime finding's wording found on its line (``evidence["lint"]``, same hazard: the
    static warning came true) takes the runtime finding's severity when that is graver (a DDP101 seen happen is
    an error; a DDP403 seen happen stays advice) and says so (report/v1 lint finding dicts, changed in place)."""
    for rf in runtime:
        mark = rf["evidence"].get("lint")
        if not isinstance(mark, dict):
            continue
        for lf in lint:
            ll = lf.get("location") or {}
            if (lf["code"], ll.get("path"), ll.get("line")) == (mark.get("code"), mark.get("path"), mark.get("line")):
                if severity_rank(rf["severity"]) > severity_rank(lf["severity"]):
                    lf["severity"] = rf["severity"]
                lf["confirmed_by_runtime"] = rf["code"]
                mark["message"] = lf["message"]
                break


def earlier_attempt(earlier, lint: tuple[LintMark, ...]) -> dict[str, Any]:
    """The diagnosis of an attempt torch's agent restarted after a failure (``--max-restarts``)."""
    evidence = earlier.evidence.with_(lint=lint)
    verdict, findings, failed_diagnosis = diagnose_guarded(evidence, earlier.decision, {})
    return {"attempt": earlier.attempt, "verdict": verdict, **({"diagnosis_error": failed_diagnosis}
                                                               if failed_diagnosis else {}),
            "findings": [f.to_report_dict() | {"source": "runtime"} for f in findings],
            "ranks": [state_entry(r, st, {}) for r, st in sorted(evidence.ranks.items())]}


_RANK_EXTRAS = ("host", "pid", "local_rank", "timing", "timeline", "workers", "exc", "where", "forwards",
                "steps_by_epoch", "loaders", "ddp")


def rank_state_word(st: RankState, ex: ExitStatus | None, lost: bool = False) -> RankWord:
    """The report's one-word state of a rank (``lost``: its node's launcher went silent)."""
    if st.missing:
        return RankWord.MISSING
    if lost and not st.exc and not ex:
        return RankWord.LOST
    if st.exc:
        return RankWord.CRASHED
    if ex and ex.killed:
        return RankWord.KILLED
    if st.done:
        return RankWord.FINISHED
    if st.in_collective:
        return RankWord.IN_COLLECTIVE
    if st.in_data_wait:
        return RankWord.DATA_WAIT
    if ex:
        return RankWord.STOPPED if ex.signal == "SIGTERM" else RankWord.EXITED
    return RankWord.RUNNING


def state_entry(r: int, st: RankState, failures: dict[int, ExitStatus], lost: set[int] = frozenset()) -> dict[str, Any]:
    """The report/v1 entry of one rank from its published state (``report.rank_entry``)."""
    ex = st.exit or failures.get(r)
    stack = st.stack
    if not stack and st.exc:
        stack = st.exc.traceback
    extras = {} if st.missing else {k: plain(v) for k in _RANK_EXTRAS if (v := getattr(st, k)) is not None}
    return rank_entry(r, rank_state_word(st, ex, r in lost), epoch=st.epoch, step=None if st.missing else st.step,
                      last_collective=plain(st.in_collective or st.last_collective), stack=plain(stack),
                      exit_code=ex.exit_code if ex else st.exit_code, signal=ex.signal if ex else None, **extras)


def emit(job, report: dict[str, Any], is_host: bool) -> int:
    if not is_host and job.store is not None:
        # one job, one diagnosis: take the hosting node's report (it names global ranks)
        end = time.monotonic() + 20
        while time.monotonic() < end:
            try:
                if job.store.check([side.REPORT]):
                    report = json.loads(job.store.get(side.REPORT))
                    with contextlib.suppress(Exception):  # (a counter someone else wrote: refused, counted)
                        job.store.add(side.REPORT_READ, 1)
                    break
            except Exception:
                if getattr(job.store, "lost", True) or not getattr(job.store, "connected", True):
                    break  # no side channel: this node's own report
            time.sleep(0.2)
    elif job.store is not None and job.own:
        try:
            job.store.set(side.REPORT, json.dumps(report))
            followers = job.nnodes - 1
            end = time.monotonic() + (10 if followers > 0 else 0)
            while followers > 0 and time.monotonic() < end and job.store.add(side.REPORT_READ, 0) < followers:
                time.sleep(0.2)
        except Exception:
            pass
    save_and_print(job, report)
    return int(report["exit_code"])


def save_and_print(job, report: dict[str, Any]) -> None:
    """Write the report where the user asked (``--report``, ``--html``), with the source lines it quotes, and
    print it (unless ``--quiet``)."""
    try:
        from ddp_doctor.report.snippets import attach_snippets

        report = attach_snippets(report, allowed=set(report.get("sources") or ()))
    except Exception:
        pass
    from ddp_doctor.report.files import save_reports

    failed = [s for s in save_reports(report, job.own.get("--report"), job.own.get("--html")) if not s.ok]
    if not job.own.get("--quiet") or failed:  # a report that went nowhere it was asked: the diagnosis is here
        print_text(report)
    for s in failed:
        print(s.notice(), file=sys.stderr)




def live_rows(watcher) -> list[dict[str, Any]]:
    """LiveView rows from the watcher's latest states (plain data; the view formats)."""
    rows = []
    for r, v in sorted(watcher.views.items()):
        st = v.state
        if st is None:
            rows.append({"rank": r, "state": RankWord.STARTING.value, "epoch": None, "step": None, "steps_per_s": None,
                         "data_wait_pct": None, "where": ""})
            continue
        times = st.step_times[-20:]
        tm = st.timing
        c = st.in_collective
        w = (c.site if c else None) or st.where
        rows.append({
            "rank": r,
            "state": (RankWord.FINISHED.value if st.done else "in " + c.op if c else "data wait" if st.in_data_wait else "running"),
            "epoch": st.epoch, "step": st.step,
            "steps_per_s": round(len(times) / sum(times), 2) if times and sum(times) > 0 else None,
            "data_wait_pct": round(100 * tm.data_wait_s / tm.step_time_s, 1) if tm and tm.step_time_s else None,
            "where": f"{os.path.basename(w.path)}:{w.line}" if w else "",
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


