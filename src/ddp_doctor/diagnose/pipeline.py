"""Pipeline schedules whose stages did not run alike: they ran its ``step`` a different number of times (a hang
inside the schedule), or split their batches into different numbers of micro-batches.

A stage blocked in the schedule's point-to-point sends and receives shows no collective; the stage it waits
for has left the schedule and waits in a collective the first never enters (a barrier after the loop), so
by positions alone the waiting stage looks like the culprit.  The probe counts each rank's calls of the
schedule's ``step`` (``apis.STEP_OP``): the rank that ran it more often, stuck inside it, is the one whose
loop ran longer.  Explains a stop, never makes one."""
from __future__ import annotations

import os

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.apis import STEP_OP
from ddp_doctor.evidence import Collective, RankState, Site
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.common import loc, others_text, rank_site, step_evidence, where


def step_calls(st: RankState) -> int:
    """How many times the rank called a pipeline schedule's ``step``."""
    return sum(sc.calls for sc in st.site_counts if sc.op == STEP_OP)


def ran_schedule_more(out_coll: dict[int, RankState], ranks: dict[int, RankState]
                      ) -> tuple[list[int], dict[int, int], Site | None] | None:
    """(ranks outside collectives that called the schedule's step more often than every other rank, each
    rank's count, the line they call it at), or None."""
    counts = {r: step_calls(st) for r, st in ranks.items() if not st.missing}
    top = max(counts.values(), default=0)
    fault = sorted(r for r in out_coll if counts.get(r) == top)
    if not top or not fault or len(fault) == len(counts) or any(counts[r] == top for r in counts if r not in fault):
        return None
    site = next((sc.site for sc in ranks[fault[0]].site_counts if sc.op == STEP_OP and sc.site), None)
    return fault, counts, site


def schedule_finding(found, ranks: dict[int, RankState], in_coll: dict[int, Collective], how: str,
                     stall: dict) -> Draft:
    fault, counts, site = found
    rs = ", ".join(map(str, fault))
    each = ", ".join(f"rank {r}: {n}" for r, n in sorted(counts.items()))
    msg = (f"Rank {rs} called the pipeline schedule's step at {where(site)} more often than the other stages "
           f"(step calls: {each}) and waits inside it, in its point-to-point sends and receives, for stages "
           f"that have left the schedule: {others_text(ranks, set(fault))}. Every stage must run every step: "
           f"its sends and receives pair with the other stages' own. {how}.")
    ev = {"step_calls": {str(r): n for r, n in counts.items()},
          "in_collective": {str(r): c for r, c in in_coll.items()},
          "where": {str(r): rank_site(ranks[r]) for r in fault}, **stall, **step_evidence(ranks)}
    return Draft("DDP201", msg, runtime_fix("DDP201.count"), location=loc(site), ranks=fault, evidence=ev)


def in_schedule(st: RankState) -> bool:
    """The rank's exception was raised inside a pipeline schedule's step (its loss, its receives)."""
    return st.exc is not None and any(f"{os.sep}pipelining{os.sep}" in f.path for f in st.exc.traceback)


def microbatch_split(ranks: dict[int, RankState], showed: str) -> Draft | None:
    """DDP203 when the stages' schedules split their batches into different numbers of micro-batches (the
    probe read each schedule's count as the rank ran its step): their sends and receives pair micro-batch by
    micro-batch, so a stage got micro-batches of another size or count than its own inputs or targets --
    a batch-size error in its loss, or a receive that never completes.  ``showed``: how that showed."""
    split = {r: st.microbatches[-1] for r, st in sorted(ranks.items()) if st.microbatches}
    if len(split) < 2 or len({m.n for m in split.values()}) < 2:
        return None
    by_n: dict[int, list[int]] = {}
    for r, m in split.items():
        by_n.setdefault(m.n, []).append(r)
    sizes = sorted(map(len, by_n.values()))
    fault = sorted(r for rs in by_n.values() if len(rs) < sizes[-1] or sizes.count(sizes[-1]) > 1 for r in rs)
    each = "; ".join(f"rank {r}: {m.n} at {where(m.site)}" for r, m in split.items())
    msg = (f"The pipeline stages split their batches into different numbers of micro-batches at the schedule's "
           f"step ({each}). A schedule's sends and receives pair micro-batch by micro-batch, so each stage gets "
           f"micro-batches cut for another stage's count; {showed}.")
    site = split[fault[0]].site
    return Draft("DDP203", msg, runtime_fix("DDP203.microbatches"), location=loc(site), ranks=fault,
                 evidence={"microbatches": {str(r): m.n for r, m in split.items()}, **step_evidence(ranks)},
                 chosen=("n_microbatches", 1), chosen_by=tuple((r, (("n_microbatches", str(m.n)),))
                                                              for r, m in split.items()))
