"""DDP101 (uneven steps: which ranks ran fewer optimizer steps, why, and where) and DDP102 (set_epoch missing)."""
from __future__ import annotations

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.evidence import JobEvidence, LoaderState, Site
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.common import FIX_101, lint_line, loc, ranks_of, step_evidence, where
from ddp_doctor.diagnose.stepexit import skipped_syncs


_NO_LOADER = LoaderState()


def uneven_steps(ranks, epoch, steps: dict[int, int], how: str, *, lint=None, fallback=None, near=None) -> Draft:
    """DDP101: which ranks are the cause (skipped batches / uneven data / fewer steps) and where."""
    hi = max(steps.values())
    fewer = sorted(r for r, n in steps.items() if n != hi)
    tls = {r: st.train_loader_state() or _NO_LOADER for r, st in ranks.items()}
    site = next((t.site for t in tls.values() if t.site), None)
    # skipped batches in the epoch that differs (every epoch when the count is over the whole run)
    skips = {r: (t.skips_by_epoch[epoch] if isinstance(epoch, int) and epoch < len(t.skips_by_epoch)
                 else sum(t.skips_by_epoch)) for r, t in tls.items()}
    lens = {r: t.len for r, t in tls.items()}
    known = {n for n in lens.values() if isinstance(n, int) and n >= 0}
    first_batches = {r: t.batches_by_epoch[0] for r, t in tls.items() if len(t.batches_by_epoch) > 1}
    synced = {r: st.syncs_skipped for r, st in ranks.items() if not st.missing}
    if synced and max(synced.values()) > min(synced.values()):
        # a DDP forward prepared a gradient sync and no backward followed, on some ranks only
        cause, culprits = "sync", sorted(r for r, n in synced.items() if n > min(synced.values()))
        first = next((x for x in ranks[culprits[0]].skipped_syncs if x.site), None)
        near = near if near is not None else (first.site if first else None)
    elif skips and max(skips.values()) > min(skips.values()):
        cause, culprits = "skip", sorted(r for r, n in skips.items() if n > min(skips.values()))
    elif len(known) > 1 or (len(first_batches) == len(ranks) and len(set(first_batches.values())) > 1):
        cause, culprits = "data", sorted(ranks)
    else:
        cause, culprits = "steps", (fallback or fewer or sorted(steps))
    location = site
    if cause != "data":
        location = lint_line(lint, "DDP101", near or (site and Site(site.path, 0)),
                             site.path if site else None) or near or site
    txt = ", ".join(f"rank {r}: {n}" for r, n in sorted(steps.items()))
    where_skipped = "; ".join(
        f"rank {r}: " + ", ".join([f"batch {b} of epoch {e}" for e, b in tls[r].skipped_batches
                                   if not isinstance(epoch, int) or e == epoch][:4])
        for r in culprits if any(not isinstance(epoch, int) or e == epoch for e, _ in tls[r].skipped_batches))
    sync_txt = "; ".join(
        f"rank {r}: " + ", ".join(f"iteration {x.iteration}" + (f" of epoch {x.epoch}" if x.epoch is not None else "")
                                  + f" (DDP forward at {where(x.site)})" for x in ranks[r].skipped_syncs[:3])
        for r in culprits if cause == "sync" and ranks[r].skipped_syncs)
    skipped_in = f"in epoch {epoch}" if isinstance(epoch, int) else "in all"
    why = {"sync": f"rank {', '.join(map(str, culprits))} ran a DDP forward that prepared a gradient sync and then "
                   f"no backward, so its gradient all-reduce never ran ({sync_txt or 'skipped per rank: ' + str(synced)})",
           "skip": f"rank {', '.join(map(str, culprits))} skipped batches without an optimizer step "
                   f"(skipped {skipped_in}, per rank: {dict(sorted(skips.items()))}"
                   + (f"; {where_skipped}" if where_skipped else "") + ")",
           "data": f"the ranks' loaders yield different numbers of batches (len(loader) per rank: "
                   f"{dict(sorted(lens.items()))})",
           "steps": f"rank {', '.join(map(str, culprits))} left the epoch early"}[cause]
    lead = (f"In epoch {epoch} the ranks' gradient syncs fell out of step (optimizer steps: {txt})" if cause == "sync"
            else f"In epoch {epoch} the ranks ran different numbers of optimizer steps ({txt})")
    msg = (f"{lead}: {why}. DDP all-reduces "
           "gradients once per step, so the extra steps pair with the other ranks' next ones (gradients of "
           f"different iterations averaged) until the job hangs or crashes; {how}.")
    if cause != "data" and location is not None and location is not site and location is not near:
        msg += " The line shown is where ddp-doctor lint located the rank-local skip."
    return Draft("DDP101", msg, FIX_101, location=loc(location), ranks=culprits,
                 evidence={"epoch": epoch, "steps_in_epoch": {str(r): n for r, n in steps.items()},
                         "cause": cause, "skipped_batches": {str(r): n for r, n in skips.items()},
                         "skipped_syncs": {str(r): ranks[r].syncs_skipped for r in ranks},
                         "loader_len": {str(r): n for r, n in lens.items()}, **step_evidence(ranks)},
                 after_forward=cause == "sync")


def syncs_out_of_step(ev: JobEvidence) -> list[Draft]:
    """A warning for a job that ended well: some ranks ran the training forward, which prepared a gradient sync,
    and no backward after it more often than the others (counted by the probe).  DDP runs a pending sync at the
    rank's next backward, so the job can end without a hang while that rank's gradient all-reduces pair with
    the others' of other steps: the replicas were averaged out of step, silently."""
    ranks = ranks_of(ev)
    culprits = skipped_syncs(ranks)
    if not culprits:
        return []
    counts = {r: st.syncs_skipped for r, st in sorted(ranks.items()) if not st.missing}
    first = next(x for x in ranks[culprits[0]].skipped_syncs if x.site)
    seen = "; ".join(f"rank {r}: its sync-preparing forwards " + ", ".join(f"#{x.iteration}" for x in
                                                                         ranks[r].skipped_syncs[:3]) for r in culprits)
    msg = (f"Rank {', '.join(map(str, culprits))} ran the DDP forward at {where(first.site)}, which prepared a "
           f"gradient sync, and then no backward ({seen}; per rank: "
           + ", ".join(f"rank {r}: {n}" for r, n in counts.items()) + "). DDP runs a pending sync at the rank's next "
           "backward, so each gradient all-reduce it made after that paired with the other ranks' of another step: "
           "the job ended, but its replicas averaged gradients out of step.")
    return [Draft("DDP101", msg, FIX_101, location=loc(first.site), severity="warning", ranks=culprits,
                  evidence={"skipped_syncs": {str(r): n for r, n in counts.items()}, **step_evidence(ranks)},
                  after_forward=True)]


# -- DDP102 --------------------------------------------------------------------------------
def diagnose_sampler(ev: JobEvidence) -> list[Draft]:
    out: dict[tuple, Draft] = {}
    for r, st in ranks_of(ev).items():
        for ld in st.loaders:
            s = ld.sampler
            if s is None or s.type != "DistributedSampler" or s.shuffle is False:
                continue
            seen = s.epochs_seen
            if len(seen) >= 2 and not s.set_epoch_calls and len(set(seen)) == 1:
                site = ld.site
                key = (site.path, site.line) if site else (None, None)
                if key in out:
                    out[key].ranks.append(r)
                    continue
                msg = (f"The DataLoader at {where(site)} was iterated for {len(seen)} epochs with a shuffling "
                       f"DistributedSampler whose epoch stayed {seen[0]}: set_epoch() was never called, so every "
                       "epoch sees the same order.")
                out[key] = Draft("DDP102", msg, runtime_fix("DDP102"), location=loc(site), ranks=[r],
                                 evidence={"sampler": s, "epochs": len(seen)})
    return list(out.values())

