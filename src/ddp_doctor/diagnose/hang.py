"""A hang: from where the ranks are stuck, DDP201/202/203 (a subset in a collective), DDP101 (ranks at
different steps), DDP205 (stalled outside collectives, or every rank stuck in one transport call).  Who is to
blame is decided by the one judge (``diagnose/stuck.py``), asked through :class:`ProbeStates`; this module
asks the probe-only questions first and words the judge's answer with the probe's facts."""
from __future__ import annotations

import os
from dataclasses import replace

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.evidence import Collective, JobEvidence, LintMark, RankState, Verdict
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.collectives import blame_positions, finding_for_blame, not_member_blame, on_group
from ddp_doctor.diagnose.common import (FIX_201, FIX_202, blocked_words, doing, loc, others_text, rank_site,
                                        ranks_of, step_evidence, user_frame, where)
from ddp_doctor.diagnose.exits import diagnose_exit
from ddp_doctor.diagnose.pipeline import microbatch_split, ran_schedule_more, schedule_finding
from ddp_doctor.diagnose.steps import uneven_steps
from ddp_doctor.diagnose.stuck import DATA, PEER, Kind, Standing, Stuck, judge


class ProbeStates:
    """``run``'s evidence for the judge (``diagnose.stuck``): the probe states of the live ranks, and their
    history (the collectives each rank ever issued and where)."""

    def __init__(self, ev: JobEvidence):
        self.ranks = ranks_of(ev)
        self.marks = tuple(ev.lint)

    def standings(self) -> dict[int, Standing]:
        return {r: Standing(r, st.in_collective, gone=not _live(st),
                            waits_on=DATA if st.in_data_wait else PEER if st.outside and st.outside.peer() else None)
                for r, st in self.ranks.items()}

    def history(self) -> dict[int, RankState]:
        return self.ranks

    def lint(self) -> tuple[LintMark, ...]:
        return self.marks


def _live(st: RankState) -> bool:
    return not st.missing and not st.done and not st.exc and st.exit is None


def diagnose_hang(ev: JobEvidence, d: Verdict) -> list[Draft]:
    """The hang's finding: what only the probe knows first (ranks that passed a group they are not in, pipeline
    stages that split their batches differently, collectives of several groups), then the one judge
    (``diagnose.stuck.judge``), worded with the probe's facts."""
    src = ProbeStates(ev)
    ranks = src.ranks
    live = {r: st for r, st in ranks.items() if _live(st)}
    stall = {"stalled_s": d.stalled_s, "hang_limit_s": d.limit_s, "hang_limit_how": d.limit_how}
    in_coll = {r: st.in_collective for r, st in live.items() if st.in_collective}
    out_coll = {r: st for r, st in live.items() if r not in in_coll}
    how = (f"No rank progressed for {d.stalled_s}s (hang limit {d.limit_s}s)" if d.stalled_s is not None
           else f"The ranks stopped progressing ({d.limit_how})" if d.limit_how else "The ranks stopped progressing")
    calls = {**in_coll, **{r: None for r in out_coll}}
    skipped = not_member_blame(calls, ranks)
    if skipped:  # members that passed a group they are not in where the others wait: whatever else they do now
        return [skipped.finding(ranks, how)]
    split = microbatch_split(ranks, f"now {others_text(ranks, set())}. {how}")
    if split is not None:  # pipeline stages that split their batches differently: their receives never pair
        return [split]
    if len({c.group for c in in_coll.values()}) > 1 and not (out_coll and all(st.in_data_wait for st in out_coll.values())):
        # collectives of several groups: each position is judged against its own group's members
        b = blame_positions(in_coll, ranks)
        if b:
            return [b.finding(ranks, how)]
    j = judge(src)
    if j.kind == Kind.STALL:
        fix = runtime_fix("DDP205.pg-timeout") if d.kind == "pg-timeout" and not all(
            st.in_data_wait for st in out_coll.values()) else None
        return [stall_finding(ranks, {r: ranks[r] for r in j.ranks}, stall, partial=in_coll, fix=fix)]
    if j.kind == Kind.SUBSET:
        sched = ran_schedule_more(out_coll, ranks)
        if sched:  # a stage inside a pipeline schedule it ran more often than the others
            return [schedule_finding(sched, ranks, in_coll, how, stall)]
        return [_subset_finding(j, ranks, out_coll, how, stall)]
    if j.kind == Kind.PAIRED and j.blame is not None:  # (``judge`` gives every PAIRED answer its blame)
        seqs = {c.seq for c in in_coll.values()}
        if len({c.op for c in in_coll.values()}) == 1 and len(seqs) > 1:
            steps = {r: st.step for r, st in live.items()}
            if len(set(steps.values())) > 1:
                return [uneven_steps(ranks, "(all)", steps, how.lower(), lint=ev.lint)]
        seq = min(c.seq for c in in_coll.values())
        group = next(iter(in_coll.values())).group
        return [finding_for_blame(j.blame, in_coll, ranks, group, seq, how)]
    if j.kind == Kind.GONE:  # every live rank waits in the very same collective: someone is missing from it
        return diagnose_exit(ev, Verdict("exit", finished=True))
    if j.kind == Kind.TRANSPORT:
        c = next(iter(in_coll.values()))
        msg = (f"Every rank waits inside the same {c.op} (#{c.seq} on {c.group}) at {where(c.site)} "
               f"and it has not completed: the transport is stuck (network, a dead peer on another node, GPU). {how}.")
        return [Draft("DDP205", msg, runtime_fix("DDP205.transport"),
                      location=loc(c.site), ranks=sorted(in_coll), evidence={**stall, "collective": c})]
    return [stall_finding(ranks, live, stall)]


def _subset_finding(j: Stuck, ranks: dict[int, RankState], out_coll: dict[int, RankState], how: str,
                    stall: dict) -> Draft:
    """DDP201/202: the waiting ranks are in a collective the others never entered."""
    c = j.waiting[j.ranks[0]]
    msg = (f"Rank {', '.join(map(str, j.ranks))} waits in {c.op}() at {where(c.site)} "
           f"(collective #{c.seq} on {on_group(c.group, ranks)}), which the other ranks never entered: "
           f"{others_text(ranks, set(j.ranks))}. {how}.")
    ev_ = {"group": c.group, "seq": c.seq, "in_collective": {str(r): x for r, x in j.waiting.items()},
           "where": {str(r): rank_site(st) for r, st in out_coll.items()}, **stall, **step_evidence(ranks)}
    return Draft(j.code, msg, FIX_201 if j.code == "DDP201" else FIX_202, location=loc(c.site),
                 ranks=list(j.ranks), evidence=ev_)


def stall_finding(ranks: dict[int, RankState], stuck: dict[int, RankState], stall: dict,
                  partial: dict[int, Collective] | None = None, fix: str | None = None) -> Draft:
    """DDP205: ranks stuck outside collectives (loader, I/O, a lock); show where, and the workers."""
    parts = []
    workers_ev = {}
    for r, st in sorted(stuck.items()):
        txt = f"rank {r} {doing(st)}"
        ws = []
        for w in st.workers:
            uf = user_frame(w.stack) or (w.stack[-1] if w.stack else None)
            if uf:
                ws.append(f"worker {w.pid} at {where(uf)}" + (", one thread waiting on a lock no thread of its "
                                                              "process can release" if w.frozen else ""))
            workers_ev[str(w.pid)] = {"rank": r, "at": uf}
        if ws:
            txt += " (" + "; ".join(ws) + ")"
        parts.append(txt)
    first = min(stuck)
    site = None
    for w in stuck[first].workers:
        site = user_frame(w.stack)
        if site:
            break
    site = site or rank_site(stuck[first])
    idle = {r: st.idle_s for r, st in stuck.items() if st.idle_s is not None}
    life = ""
    if idle and min(idle.values()) >= 1:
        life = (f" Rank {', '.join(map(str, sorted(idle)))} showed no sign of life (CPU, I/O, Python stack) "
                f"for {min(idle.values()):.0f}s.")
    if stall["stalled_s"] is not None:
        ended = f"for {stall['stalled_s']}s."
    else:  # the others' collective timed out first (monitored_barrier, a short process-group timeout)
        ended = f"until {stall['hang_limit_how']} -- the consequence, not the cause."
    if partial:
        waits = "; ".join(f"rank {r} waits in {c.op} (#{c.seq} on {c.group}) at {where(c.site)}"
                          for r, c in sorted(partial.items()))
        msg = (f"Rank {', '.join(map(str, sorted(stuck)))} is stuck outside collectives: {'; '.join(parts)}, "
               f"while {waits} for it.{life} No step progressed {ended}")
    else:
        msg = (f"No rank progresses and the stuck ones are not in a collective: {'; '.join(parts)}.{life} "
               f"Nothing moved {ended}")
    outside = {str(r): st.outside for r, st in stuck.items() if st.outside is not None}
    peers = any(o.peer() for o in outside.values())
    fix = fix or runtime_fix("DDP205.outside" if peers else "DDP205.stall")
    return Draft("DDP205", msg, fix, location=loc(site), ranks=sorted(stuck),
                 evidence={**stall, "where": {str(r): rank_site(st) for r, st in stuck.items()},
                           "workers": workers_ev, **({"outside": outside} if outside else {}),
                           **step_evidence(ranks)})


def still_watching(ev: JobEvidence, findings: list[Draft]) -> list[Draft]:
    """A stall's diagnosis (the job runs on): the first finding says that nothing proves the job stuck, and
    what would stop it -- a proof, the process group's own timeout (when it fires), or ``--stop-on-stall``."""
    if not findings:
        return findings
    ranks = ranks_of(ev)
    waits = [(r, st.in_collective, st.pg_timeout_s) for r, st in sorted(ranks.items())
             if st.in_collective is not None and st.pg_timeout_s and not (st.done or st.exc or st.exit)]
    timeout = ""
    if waits:
        r, c, t = max(waits, key=lambda w: w[1].waiting_s or 0.0)
        left = max(0.0, t - (c.waiting_s or 0.0))
        timeout = (f", when the process group's own timeout ({t:g}s) is about to fail it (rank {r} has waited "
                   f"{c.waiting_s or 0:.0f}s in {c.op}: in about {left:.0f}s)")
    peers = sorted({o.peer() for st in ranks.values() if st.outside and st.in_collective is None
                    for o in (st.outside,) if o.peer()})
    outside = f" -- it waits on {', '.join(peers)}, outside the job, which may still answer" if peers else ""
    note = (f"Nothing proves the job stuck{outside}: ddp-doctor keeps watching and stops it only on proof (a rank "
            f"that fails or exits while others wait for it, collectives that disagree){timeout}; "
            "`--stop-on-stall` stops it at the limit.")
    first = findings[0]
    return [replace(first, then=(*first.then, note), evidence={**first.evidence, "still_running": True}),
            *findings[1:]]


def frozen_proof(d: Verdict, findings: list[Draft]) -> list[Draft]:
    """The stall stopped on proof (``live.stall_proof``): say which fact, on the first finding."""
    if not findings:
        return findings
    first = findings[0]
    note = f"Stopped on proof: {d.limit_how}, so rank {d.rank} can never get its next batch."
    return [replace(first, then=(*first.then, note), evidence={**first.evidence, "proof": d.limit_how}),
            *findings[1:]]


def stalls_resumed(ev: JobEvidence) -> list[Draft]:
    """Info for a job that ended well after stalls: each one, with how long it lasted, where the stuck ranks
    were and what they waited on -- a stall the job came out of, never a fault by itself."""
    out = []
    for s in ev.stalls:
        if not s.where:
            continue
        lasted = s.lasted_s if s.lasted_s is not None else s.idle_s
        at_least = "" if s.lasted_s is not None else "at least "
        parts = []
        for r, site in sorted(s.where.items()):
            at = (f"in {site.function}() at {os.path.basename(site.path)}:{site.line}"
                  if site and site.function and site.function != "<module>" else f"at {where(site)}")
            txt = f"rank {r} spent {at_least}{lasted:.0f}s {at}"
            o = s.outside.get(r)
            if o is not None:
                txt += f", {blocked_words(o)}"
            parts.append(txt)
        waits = "; ".join(f"rank {r} waited in {c.op} at {where(c.site)}" for r, c in sorted(s.waiting.items()))
        msg = ("; ".join(parts) + (f", while {waits}" if waits else "") +
               f". No rank showed a sign of life (CPU, I/O, a moving stack) for more than the {s.limit_s:g}s limit; "
               "ddp-doctor reported the stall and kept watching, and the job then carried on: stalled, not stuck.")
        first = min(s.where)
        out.append(Draft("DDP205", msg, runtime_fix("DDP205.outside" if s.outside else "DDP205.slow"),
                         location=loc(s.where[first]), severity="info", ranks=sorted(s.where),
                         evidence={"stall": s}))
    return out


def slow_not_stuck(ev: JobEvidence) -> list[Draft]:
    """Info for a job that ended well: the longest live warning (no rank progressed for a while, some rank
    waited for another) -- it was slow, not stuck, so it never stopped the job."""
    s = ev.suspicion
    if s is None or not s.outside or not s.waiting:
        return []
    waits = "; ".join(f"rank {r} waited in {c.op} at {where(c.site)}" for r, c in sorted(s.waiting.items()))
    outs = "; ".join(f"rank {r} was at {where(site)}" for r, site in sorted(s.outside.items()))
    msg = (f"For {s.stalled_s:.0f}s no rank progressed: {outs}" + (f", while {waits}" if waits else "") +
           ". It then carried on: slow, not stuck (ddp-doctor stops a job only when no rank shows any sign of "
           f"life -- CPU, I/O, a moving stack -- for {s.limit_s or 0:g}s, or on proof of a desync).")
    site = next((site for site in s.outside.values() if site), None)
    return [Draft("DDP205", msg, runtime_fix("DDP205.slow"), location=loc(site), severity="info",
                  ranks=sorted(s.outside), evidence={"suspicion": s})]
