"""Merge the partial ``attach`` reports of a multi-node job (one per node) and diagnose the whole job.

Each node's ``ddp-doctor attach --report`` holds only its own ranks; the diagnosis needs all of
them (the odd rank out may live on another node).  The rank entries carry what the diagnosis
reads (activity, whether it moved, CPU used, stacks), so the merged ranks are diagnosed afresh.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.attach.classify import StackActivity
from ddp_doctor.attach.assess import diagnose_guarded
from ddp_doctor.attach.discover import RankProcess
from ddp_doctor.attach.sample import SampledRank, SampledWorker
from ddp_doctor.evidence import Site, ThreadStack
from ddp_doctor.report import REPORT_KEYS, report_v1


class MergeError(ValueError):
    """The reports cannot be merged (not attach reports, or of different jobs)."""


def _frames(stack: list[dict]) -> tuple[Site, ...]:
    return tuple(Site.from_json(f) for f in stack or [] if f.get("path"))


def _view(r: dict[str, Any], world_size: int) -> SampledRank:
    act = r.get("activity") or {}
    w = r.get("where")
    site = Site.from_json(w) if isinstance(w, dict) and w.get("path") else None
    proc = RankProcess(int(r.get("pid") or 0), int(r["rank"]), r.get("local_rank"), world_size, None, "", [])
    stack = ThreadStack("MainThread", True, _frames(r.get("stack")))
    workers = [SampledWorker(int(x.get("pid") or 0), ThreadStack("MainThread", True, _frames(x.get("stack"))),
                          float(x.get("unchanged_s") or 0)) for x in r.get("workers") or []]
    return SampledRank(proc, StackActivity(act.get("kind") or "outside", act.get("op"), site), stack, [stack],
                    float(r.get("unchanged_s") or 0), float(act.get("window_s") or 0), act.get("cpu_s"),
                    bool(act.get("moved")), gone=bool(act.get("gone")), workers=workers, io_bytes=act.get("io_bytes"))


def merge(reports: list[dict[str, Any]], names: list[str] | None = None) -> dict[str, Any]:
    """One report of the whole job from each node's partial ``attach`` report."""
    names = names or [f"report {i + 1}" for i in range(len(reports))]
    for rep, name in zip(reports, names):
        if rep.get("source") != "attach":
            raise MergeError(f"{name} is not an `ddp-doctor attach` report (only those are partial; a `run` "
                             "report already holds every rank)")
    jobs = {rep.get("job") for rep in reports}
    if len(jobs) > 1:
        raise MergeError(f"the reports are of different jobs: {', '.join(sorted(map(str, jobs)))}")
    world = max(int(rep.get("world_size") or 0) for rep in reports)
    by_rank: dict[int, dict] = {}
    for rep in reports:
        for r in rep.get("ranks") or []:
            by_rank.setdefault(int(r["rank"]), r)
    views = [_view(by_rank[k], world) for k in sorted(by_rank)]
    complete = set(by_rank) >= set(range(world))
    verdict, findings, failed = diagnose_guarded(views, world, complete)
    nodes = [n for rep in reports for n in rep.get("nodes") or []]
    kept = {k: v for k, v in reports[0].items() if k not in REPORT_KEYS and k not in ("report_path", "html_path")}
    kept.update({"nodes": nodes, "nnodes": len(set(nodes)) or len(reports), "partial": not complete,
                 "merged_from": names})
    kept.pop("diagnosis_error", None)
    if failed:
        kept["diagnosis_error"] = failed
    return report_v1(verdict, world, [f.to_report_dict() for f in findings], [by_rank[k] for k in sorted(by_rank)],
                     **kept)
