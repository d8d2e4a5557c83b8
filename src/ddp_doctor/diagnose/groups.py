"""DDP510: the processes a launcher started never formed one process group, so each trains alone.

A warning, never a verdict: nothing hangs or fails (each process all-reduces with itself), the job keeps
its exit code.  Seen from inside the ranks: the launcher's WORLD_SIZE against the size of the default
group each process initialised (``world_size=1, rank=0`` written into the script), or no group at all
in a training job (accelerate on CPU without ACCELERATE_USE_CPU=1, a script that never calls
``init_process_group``)."""
from __future__ import annotations

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.evidence import JobEvidence, RankState
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.common import loc, where


def _unused(st: RankState) -> bool:
    """A rank that trained (optimizer steps) without ever using a process group: no DDP model and not one
    collective, by the probe's count and by the group's own (accelerate's DistributedType.NO)."""
    g = st.group  # None: a probe that did not look (older evidence): nothing can be said
    return (g is not None and st.step > 0 and not st.ddp and not st.coll_count and not st.seq
            and (g.size == 0 or g.collectives == 0))


def _saw(st: RankState, world: int) -> str:
    g = st.group
    if g is None or g.size == 0:
        return f"initialised no process group and ran {st.step} training steps alone"
    at = f" at {where(g.site)}" if g.site else ""
    if g.size >= world:
        return (f"initialised the group of world size {g.size}{at} but never used it (no DDP model, not one "
                f"collective) and ran {st.step} training steps alone")
    return f"initialised a group of world size {g.size} in which it is rank {g.rank}{at}"


def diagnose_groups(ev: JobEvidence) -> list[Draft]:
    ranks = {r: st for r, st in ev.ranks.items() if not st.missing}
    world = max([st.world_size or 0 for st in ranks.values()] + [ev.world_size or 0])
    if world <= 1 or len(ranks) < 2:
        return []
    small = sorted(r for r, st in ranks.items() if st.group is not None and 0 < st.group.size < world)
    alone = sorted(r for r, st in ranks.items() if r not in small and _unused(st))
    if not (small or alone) or len(small) + len(alone) < len(ranks):
        return []
    texts = {r: _saw(ranks[r], world) for r in sorted(small + alone)}
    if len(set(texts.values())) == 1:
        who = f"every process (ranks {', '.join(map(str, texts))}) {next(iter(texts.values()))}"
    else:
        who = "; ".join(f"rank {r} {t}" for r, t in texts.items())
    how = ("DistributedSampler gives each one the whole dataset, DDP averages gradients with itself only" if small
           else "the data is not split between them, no gradient is averaged")
    msg = (f"The launcher started {world} processes (WORLD_SIZE={world}), but they never formed one process "
           f"group: {who}. Each process trains alone ({how}), so the processes repeat one another's work instead "
           "of sharing it. Nothing hangs or fails, so the launcher reports success.")
    if alone and not small:
        msg += (" accelerate on CPU does this without ACCELERATE_USE_CPU=1 (or `accelerate launch --cpu`): it "
                "then runs every process as a single-process job.")
    site = next((ranks[r].group.site for r in small + alone if ranks[r].group and ranks[r].group.site), None)
    return [Draft("DDP510", msg, runtime_fix("DDP510" if small else "DDP510.unused"), location=loc(site), ranks=sorted(small + alone),
                  evidence={"launcher_world_size": world,
                            "groups": {str(r): ranks[r].group for r in small + alone},
                            "trained_alone": alone})]
