"""Sampled ranks of a live job -> verdict and findings (pure: no I/O but an optional lint of the user's files).

``attach`` has no history (no sequence numbers), only where each rank is now and whether it moved during
the sampling window: :class:`Samples` hands exactly that to the one judge of a stuck job
(``diagnose/stuck.py::judge``), which decides as for ``run`` and Flight Recorder with what it is given -- the
cautious half of ``run``'s policy (a rank that moves is never stuck; ranks outside collectives stall the ones
that wait, unless lint flags the waiting line as rank-conditional; a rank gone while the others wait:
DDP204).  This module words the judge's answer with the samples' facts (each rank's line, its DataLoader
workers, how long nothing changed).
"""
from __future__ import annotations

from typing import Sequence

from ddp_doctor.attach.classify import StackActivity, is_user, to_collective
from ddp_doctor.attach.sample import SampledRank
from ddp_doctor.diagnose.blame import lint_rank_conditional
from ddp_doctor.diagnose import failure_text
from ddp_doctor.diagnose.common import loc, user_frame, verdict_of, where
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.diagnose.stuck import DATA, Kind, Standing, Stuck, judge
from ddp_doctor.diagnose.wording import decided
from ddp_doctor.evidence import LintMark, RankState
from ddp_doctor.findings import Finding, runtime_fix
from ddp_doctor.report.ranks import RankWord

FIX_201, FIX_202, FIX_203 = runtime_fix("DDP201"), runtime_fix("DDP202"), runtime_fix("DDP203")
FIX_204, FIX_205, FIX_TRANSPORT = runtime_fix("DDP204"), runtime_fix("DDP205.stall"), runtime_fix("DDP205.transport")


def _rank_list(ranks) -> str:
    ranks = sorted(ranks)
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _for(v: SampledRank) -> str:
    return f"rank {v.proc.rank} {v.activity.describe()}" + (
        f" (unchanged for {v.unchanged_s:.0f}s+)" if v.stuck and v.unchanged_s >= 1 else "")


def _worker_sites(v: SampledRank) -> list[tuple[int, object]]:
    out = []
    for w in v.workers:
        frames = w.stack.frames if w.stack else ()
        uf = user_frame(frames)
        if uf is not None:
            out.append((w.pid, uf))
    return out


def _evidence(views: list[SampledRank]) -> dict:
    return {"where": {str(v.proc.rank): {"activity": v.activity.kind, "op": v.activity.op,
                                          "site": v.activity.site.to_json() if v.activity.site else None,
                                          "unchanged_s": round(v.unchanged_s, 1),
                                          "cpu_s": None if v.cpu_s is None else round(v.cpu_s, 2),
                                          "io_bytes": v.io_bytes,
                                          "moved": v.moved, "pid": v.proc.pid}
                      for v in views},
            "workers": {str(w.pid): {"rank": v.proc.rank,
                                     "at": (user_frame(w.stack.frames) or w.stack.frames[-1]).to_json()
                                     if w.stack and w.stack.frames else None}
                        for v in views for w in v.workers}}


def _lint(views: list[SampledRank]) -> tuple[LintMark, ...]:
    """lint's rank-conditional lines in the user's files the ranks stand in."""
    return lint_rank_conditional(f.path for v in views if v.stack for f in v.stack.frames if is_user(f))


def judge_samples(views: list[SampledRank], world_size: int, whole_job_here: bool,
             lint: Sequence[LintMark] | None = None) -> tuple[str, list[Finding]]:
    """Verdict (ok | hang | crash) and findings for one sampled job; ``lint``: lint's marks (default: lint the
    user's files the ranks stand in).  Each finding located at the decision where the ranks parted, as run's
    (``diagnose.provenance``: from the sampled stacks; py-spy reads no values)."""
    verdict, findings = _assess(views, world_size, whole_job_here, lint)
    ranks = {v.proc.rank: RankState(rank=v.proc.rank, stack=tuple(v.stack.frames) if v.stack else ())
             for v in views if not v.gone}
    return verdict, decided(findings, ranks)


def diagnose_guarded(views: list[SampledRank], world_size: int, whole_job_here: bool
                     ) -> tuple[str, list[Finding], str | None]:
    """:func:`judge_samples`, and when it raises (a bug of ours), the verdict the samples alone give (a rank gone:
    crash; every live rank stuck: hang) with no finding and the error in words: the stacks are kept."""
    try:
        verdict, findings = judge_samples(views, world_size, whole_job_here)
        return verdict, findings, None
    except Exception as e:
        live = [v for v in views if not v.gone]
        verdict = verdict_of("exit" if len(live) < len(views) else "hang" if live and all(v.stuck for v in live)
                             else None)
        return verdict, [], failure_text(e)


class Samples:
    """``attach``'s evidence for the judge (``diagnose.stuck``): where each sampled rank stands and whether it
    moved during the sampling window; no history (a stack has no sequence numbers), lint's marks."""

    def __init__(self, views: list[SampledRank], world_size: int, whole_job_here: bool, lint: Sequence[LintMark]):
        self.views = {v.proc.rank: v for v in views}
        found = set(self.views)
        self.missing = sorted(set(range(world_size)) - found) if whole_job_here else []
        self.marks = tuple(lint)

    def standings(self) -> dict[int, Standing]:
        out = {r: Standing(r, to_collective(v.activity), gone=v.gone,
                           moving=not v.gone and not v.stuck, waits_on=DATA if v.activity.kind == "data" else None)
               for r, v in self.views.items()}
        return {**out, **{r: Standing(r, gone=True) for r in self.missing}}

    def history(self) -> None:
        return None

    def lint(self) -> tuple[LintMark, ...]:
        return self.marks


def _assess(views: list[SampledRank], world_size: int, whole_job_here: bool,
            lint: Sequence[LintMark] | None) -> tuple[str, list[Finding]]:
    src = Samples(views, world_size, whole_job_here, _lint(views) if lint is None else tuple(lint))
    live = [v for v in views if not v.gone]
    ev = _evidence(views)
    j = judge(src)
    waiting = [v for v in live if v.proc.rank in j.waiting]
    if j.kind == Kind.GONE:
        others = "; ".join(_for(v) for v in waiting)
        how = ", ".join(f"rank {r} " + ("is not running (no process on this node)" if r in src.missing
                                          else "has exited (zombie, not yet reaped)") for r in j.ranks)
        msg = f"{how.capitalize()} while the others wait for it: {others}."
        return "crash", [Draft("DDP204", msg, FIX_204, location=loc(j.site), ranks=list(j.ranks),
                               evidence={**ev, "gone": list(j.ranks)})]
    if j.kind == Kind.NONE:
        return "ok", []
    if j.kind == Kind.BUSY:
        return "ok", _busy_notes(live)
    culprits = [v for v in live if v.proc.rank in j.ranks]
    if j.kind == Kind.SUBSET:
        return "hang", [_subset(j.code, culprits, [v for v in live if v not in culprits], ev, j.lint_seen)]
    if j.kind == Kind.STALL:
        return "hang", [_stall(culprits, waiting, ev)]
    if j.kind == Kind.PAIRED:
        return "hang", [_disagreement(j, waiting, ev)]
    if j.kind == Kind.TRANSPORT:
        a = waiting[0].activity
        if whole_job_here:
            msg = (f"Every rank waits inside the same {a.op} at {where(a.site)} and it has not completed: the "
                   "transport is stuck (network, a dead peer, GPU).")
        else:
            msg = (f"Every rank on this node waits inside {a.op} at {where(a.site)}: a rank on another node is "
                   "elsewhere, or the transport is stuck. Attach on every node and merge the reports with "
                   "`ddp-doctor report a.json b.json ...` to name it.")
        return "hang", [Draft("DDP205", msg, FIX_TRANSPORT, location=loc(a.site),
                              ranks=sorted(v.proc.rank for v in views), evidence=ev)]
    return "hang", [_stall(live, [], ev)]


def _subset(code: str, fault: list[SampledRank], others: list[SampledRank], ev: dict, lint_seen: bool = False) -> Draft:
    a = fault[0].activity
    msg = (f"{_rank_list(v.proc.rank for v in fault).capitalize()} {'waits' if len(fault) == 1 else 'wait'} in "
           f"{a.op}() at {where(a.site)}, a collective the other ranks never entered: "
           + "; ".join(_for(v) for v in others) + ".")
    if lint_seen:
        msg += f" ddp-doctor lint flags that line as {code} (reached under a rank-dependent condition)."
    return Draft(code, msg, FIX_201 if code == "DDP201" else FIX_202, location=loc(a.site),
                 ranks=sorted(v.proc.rank for v in fault), evidence=ev)


def _disagreement(j: Stuck, inside: list[SampledRank], ev: dict) -> Draft:
    """Ranks stuck in different collectives: the odd ones out, as the judge decided (``diagnose.stuck``)."""
    fault = [v for v in inside if v.proc.rank in j.ranks]
    if j.code in ("DDP201", "DDP202"):
        return _subset(j.code, fault, [v for v in inside if v not in fault], ev, lint_seen=j.lint_seen)
    msg = ("At the same point the ranks wait in different collectives, which never pair: "
           + "; ".join(_for(v) for v in sorted(inside, key=lambda v: v.proc.rank)) + ".")
    return Draft("DDP203", msg, FIX_203, location=loc(j.site), ranks=list(j.ranks), evidence=ev)


def _stall(stuck: list[SampledRank], waiting: list[SampledRank], ev: dict) -> Draft:
    parts = []
    site = None
    for v in sorted(stuck, key=lambda v: v.proc.rank):
        ws = _worker_sites(v)
        parts.append(_for(v) + (" (" + "; ".join(f"DataLoader worker {pid} at {where(s)}" for pid, s in ws) + ")"
                                if ws else ""))
        if site is None:
            site = ws[0][1] if ws else v.activity.site
    msg = ("No progress, and the stuck " + ("rank is" if len(stuck) == 1 else "ranks are") +
           " not in a collective: " + "; ".join(parts) + ".")
    if waiting:
        msg += " Meanwhile " + "; ".join(_for(v) for v in sorted(waiting, key=lambda v: v.proc.rank)) + "."
    return Draft("DDP205", msg, FIX_205, location=loc(site), ranks=sorted(v.proc.rank for v in stuck),
                 evidence=ev)


def _busy_notes(live: list[SampledRank]) -> list[Draft]:
    """Some rank still moves or computes: not a hang (yet). Say who waits on whom, as a warning."""
    waiting = [v for v in live if v.activity.in_collective and v.stuck]
    busy = [v for v in live if not v.stuck]
    if not waiting:
        return []
    msg = ("Not a hang yet: " + "; ".join(
        f"rank {v.proc.rank} is busy and {v.activity.describe()}"
        + (f" ({v.cpu_s / v.window_s:.0%} CPU)" if v.cpu_s else "")
        for v in sorted(busy, key=lambda v: v.proc.rank)) + ", while " + "; ".join(_for(v) for v in waiting) +
        ". Attach again later; if the busy rank's line never changes it is the one to look at.")
    b = sorted(busy, key=lambda v: v.proc.rank)[0]
    return [Draft("DDP205", msg, FIX_205, location=loc(b.activity.site), severity="warning",
                  ranks=sorted(v.proc.rank for v in busy), evidence=_evidence(live))]


def activity_state(a: StackActivity, gone: bool) -> RankWord:
    """The report's word for a sampled rank."""
    if gone:
        return RankWord.EXITED
    if a.in_collective:
        return RankWord.IN_COLLECTIVE
    return {"data": RankWord.DATA_WAIT, "no_python": RankWord.UNKNOWN}.get(a.kind, RankWord.RUNNING)
