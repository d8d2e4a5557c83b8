"""``ddp-doctor attach``: diagnose a job that is already running (and hanging), started without ddp-doctor.

discover (psutil + /proc/PID/environ) -> sample (py-spy, non-blocking, a few times) -> classify each
rank's main-thread stack -> diagnose (the rank that is not where the others are) -> a
``ddp-doctor/report/v1`` report, rendered by :mod:`ddp_doctor.report` like ``run``'s.  Nothing is
stopped unless asked (``stop_job``).
"""
from __future__ import annotations

import time
from typing import Any

from ddp_doctor.attach.assess import activity_state, diagnose_guarded
from ddp_doctor.attach.discover import DiscoveredJob, find_job
from ddp_doctor.attach.sample import SampledRank, sample_job
from ddp_doctor.attach.pyspy import AttachError
from ddp_doctor.report import report_v1
from ddp_doctor.report.ranks import rank_entry
from ddp_doctor.report.snippets import stack_sources

__all__ = ["AttachError", "attach", "attach_report", "find_job", "stop_job"]


def attach_report(job: DiscoveredJob, views: list[SampledRank], verdict: str, findings: list,
                 diagnosis_error: str | None = None) -> dict[str, Any]:
    """The report/v1 object; ``partial`` when this node holds only some of the job's ranks."""
    ranks = []
    for v in views:
        a = v.activity
        ranks.append(rank_entry(
            v.proc.rank, activity_state(a, v.gone),
            last_collective={"op": a.op, "state": "waiting" if v.stuck else "in progress"} if a.in_collective
            else None,
            stack=[f.to_json() for f in (v.stack.frames if v.stack else [])],
            where=a.site.to_json() if a.site else None, pid=v.proc.pid, local_rank=v.proc.local_rank,
            node=job.node, unchanged_s=round(v.unchanged_s, 1),
            activity={"kind": a.kind, "op": a.op, "moved": v.moved, "gone": v.gone,
                         "cpu_s": None if v.cpu_s is None else round(v.cpu_s, 3), "window_s": round(v.window_s, 3),
                      "io_bytes": v.io_bytes},
            threads=[{"name": t.name, "stack": [f.to_json() for f in t.frames]} for t in v.threads if not t.main],
            workers=[{"pid": w.pid, "stack": [f.to_json() for f in (w.stack.frames if w.stack else [])],
                      "unchanged_s": round(w.unchanged_s, 1)} for w in v.workers],
        ))
    cmd = views[0].proc.cmdline if views else []
    stacks = [st for r in ranks for st in (r["stack"], *(t["stack"] for t in r["threads"]),
                                           *(w["stack"] for w in r["workers"]))]
    return report_v1(
        verdict, job.world_size, [f.to_report_dict() for f in findings], ranks,
        sources=stack_sources(stacks),  # the files these processes ran: the only ones snippets quote
        source="attach", command=cmd, job=job.job, nodes=[job.node],
        partial=not job.whole_job_here, agent_pid=job.agent_pid,
        sampled_s=round(views[0].window_s, 1) if views else 0.0, attached_at=time.time(),
        **({"diagnosis_error": diagnosis_error} if diagnosis_error else {}),
    )


def attach(pids: list[int] | None = None, samples: int = 3, interval_s: float = 1.0) -> dict[str, Any]:
    """Find the job, sample it, diagnose it; returns the report (raises AttachError with what to do)."""
    job = find_job(pids)
    views = sample_job(job, samples, interval_s)
    verdict, findings, failed = diagnose_guarded(views, job.world_size, job.whole_job_here)
    return attach_report(job, views, verdict, findings, failed)


def stop_job(report: dict[str, Any], grace_s: float = 3.0) -> dict[int, str]:
    """Only with ``--stop``: SIGTERM torch's elastic agent first (it tears its ranks down through torch's own
    shutdown path), then SIGTERM/SIGKILL whatever rank or DataLoader worker is still running."""
    import psutil

    from ddp_doctor.procs import terminate

    def procs(pids):
        out = []
        for pid in pids:
            try:
                out.append(psutil.Process(pid))
            except psutil.Error:
                pass
        return out

    how: dict[int, str] = {}
    if report.get("agent_pid"):
        how.update(terminate(procs([report["agent_pid"]]), grace_s))
    targets = [r["pid"] for r in report["ranks"]] + [w["pid"] for r in report["ranks"] for w in r.get("workers") or []]
    left = [p for p in procs(targets) if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    how.update(terminate(left, grace_s) if left else {})
    return how
