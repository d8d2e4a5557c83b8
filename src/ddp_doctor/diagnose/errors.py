"""torch's own errors in the user's words (DDP204 cases): DDP's unused-parameter error names the parameters
and their modules, says why and what to change; a killed DataLoader worker is blamed on its loader's
line, not on the line of the main process where the error happened to surface."""
from __future__ import annotations

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.evidence import DdpModel, DdpParam, LoaderState, RankState
from ddp_doctor.evidence.torch_errors import UnusedParams, WorkerDied, unused_params, worker_died
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.common import loc, others_text, step_evidence, where

_SHOWN = 8  # parameter names shown per rank in the message (the evidence keeps every one the probe named)


def _model(st: RankState) -> DdpModel | None:
    """The DDP model an error of this rank numbered: the one whose names the probe took, else the only one."""
    named = [m for m in st.ddp if m.named_params]
    return named[-1] if named else (st.ddp[-1] if len(st.ddp) == 1 else None)


def _params_text(params: tuple[DdpParam, ...], info: UnusedParams) -> str:
    """"`head.weight`, `head.bias` of module `head` (Linear)", module by module."""
    by_module: dict[str, list[DdpParam]] = {}
    for p in params[:_SHOWN]:
        by_module.setdefault(p.module, []).append(p)
    parts = []
    for mod, ps in by_module.items():
        names = ", ".join(f"`{p.name}`" for p in ps)
        kind = f" ({ps[0].module_type})" if ps[0].module_type else ""
        parts.append(f"{names} of {'the root module' if not mod else f'module `{mod}`'}{kind}")
    left = len(info.indices) + info.more - min(len(params), _SHOWN) if params else 0
    text = "; ".join(parts) + (f" and {left} more" if left > 0 else "")
    if not params:
        text = ("parameter indices " + " ".join(map(str, info.indices)) + (f" and {info.more} more" if info.more else "")
                + " (the probe did not see the model built, so it cannot name them)")
    return text


def diagnose_unused(ranks: dict[int, RankState]) -> Draft | None:
    """DDP's "Expected to have finished reduction in the prior iteration" error, of every rank that raised it
    (never a consequence of another rank's failure, even when raised inside DDP's buffer broadcast)."""
    hit = {r: info for r in sorted(ranks) if ranks[r].exc and (info := unused_params(ranks[r].exc.message))}
    if not hit:
        return None
    rs = sorted(hit)
    models = {r: _model(ranks[r]) for r in rs}
    named = {r: (m.named_params if m else ()) for r, m in models.items()}
    first = hit[rs[0]]
    e = ranks[rs[0]].exc
    model = next((m for m in models.values() if m and m.site), None)
    built = f", built at {where(model.site)}," if model else ""
    same = len({tuple(p.name for p in ps) for ps in named.values()}) == 1 and all(named.values())
    if same or len(rs) == 1:
        what = _params_text(named[rs[0]], first)
    else:
        what = "; ".join(f"rank {r}: {_params_text(named[r], hit[r])}" for r in rs)
    who = f"Rank {rs[0]}'s" if len(rs) == 1 else f"Ranks {', '.join(map(str, rs))}: their"
    idx = "; ".join(f"{' '.join(map(str, hit[r].indices)) or ', '.join(hit[r].names)} for rank {r}" for r in rs)
    msg = (f"{who} DDP model{built} got no gradient in an iteration for {what}. DDP all-reduces the gradients "
           f"only once every parameter it manages has one, so that iteration's gradient sync never finished and "
           f"the next forward raised at {where(e.location)} (torch: \"Expected to have finished reduction in the "
           f"prior iteration\"; parameter indices {idx}). ")
    alive = [r for r, st in ranks.items() if not st.missing]
    if first.static_graph:
        msg += "The model was built with static_graph=True, and these parameters got a gradient in an earlier iteration."
        fix = runtime_fix("DDP204.unused-static-graph")
    elif first.find_unused:
        msg += ("find_unused_parameters=True is on, and DDP looks for unused parameters from what forward returns, "
                "not from the loss: these were reachable from forward's outputs yet got no gradient, so an output "
                "that the loss never used, or outputs DDP could not find in forward's return value (tensors inside "
                "a custom object rather than a tuple, list or dict).")
        fix = runtime_fix("DDP204.unused-outputs")
    elif len(rs) < len(alive):
        msg += (f"Only rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} left them without a gradient: a "
                "branch of forward that did not run there (decided by that rank's data or rank).")
        fix = runtime_fix("DDP204.unused-parameters")
    else:
        msg += ("No rank used them in the loss: a branch of forward that did not run, or an output of forward the "
                "loss does not use.")
        fix = runtime_fix("DDP204.unused-parameters")
    others = others_text(ranks, set(rs))
    if others:
        msg += f" Meanwhile: {others}."
    site = model.site if model and model.site else e.location
    return Draft("DDP204", msg, fix, location=loc(site), ranks=rs,
                 evidence={"exception": e, "unused_parameters": {str(r): list(named[r]) for r in rs},
                         "ddp_site": model.site if model else None, "raised_at": e.location,
                         **step_evidence(ranks)},
                 unused=tuple(p for r in rs for p in named[r]), ddp_site=model.site if model else None)


def _dead_worker(st: RankState) -> tuple[WorkerDied | None, LoaderState | None]:
    """The worker that died under a failed rank, and its loader: what the probe found dead (the worker's
    own exit status), else what torch's message says (pid and signal) matched to a loader by the pid."""
    w = worker_died(st.exc.message if st.exc else None)
    for ld in st.loaders:
        for x in ld.worker_exits:
            if w is None or x.pid in w.pids:
                return WorkerDied((x.pid,), x.signal, None if x.signal else x.exit_code,
                                  bool(w and w.shm)), ld
    if w is None:
        return None, None
    for ld in st.loaders:
        if set(w.pids) & set(ld.worker_pids):
            return w, ld
    tl = st.train_loader_state()
    if tl is not None and tl.num_workers:
        return w, tl
    with_workers = [ld for ld in st.loaders if ld.num_workers]
    return w, (with_workers[0] if len(with_workers) == 1 else None)


def _worker_words(w: WorkerDied) -> tuple[str, str]:
    """(what happened to the worker, the fix key)."""
    if w.signal == "SIGKILL":
        return ("was killed by SIGKILL — likely out of memory (the kernel's OOM killer; check `dmesg`)",
                "DDP204.worker-oom")
    if w.signal == "SIGBUS" or w.shm:
        return (f"was killed by {w.signal or 'a signal'} — likely out of shared memory (/dev/shm) for the batches "
                "it passes to the rank", "DDP204.worker-shm")
    if w.signal:
        return f"was killed by {w.signal}", "DDP204.worker-signal"
    if w.exit_code is not None:
        return f"exited with code {w.exit_code}", "DDP204.worker-exit"
    return "exited unexpectedly", "DDP204.worker-exit"


def diagnose_worker_died(ranks: dict[int, RankState], r: int) -> Draft | None:
    """Rank ``r`` raised the DataLoader's error about a dead worker: blame the loader, name pid and signal."""
    st = ranks[r]
    w, ld = _dead_worker(st)
    if w is None or st.exc is None:
        return None
    e = st.exc
    what, fix_key = _worker_words(w)
    pids = ", ".join(map(str, w.pids))
    loader = ""
    if ld is not None:
        loader = (f" It was one of the {ld.num_workers} workers" if ld.num_workers else " It was a worker") + \
            f" of the DataLoader built at {where(ld.site)}."
    msg = (f"Rank {r}'s DataLoader worker (pid {pids}) {what}.{loader} The rank's main process only noticed it at "
           f"{where(e.location)}, where torch raised {e.type}: \"{' '.join(e.message.split())[:160]}\"; that line is "
           f"not the cause. Meanwhile: {others_text(ranks, {r})}.")
    site = ld.site if ld and ld.site else e.location
    return Draft("DDP204", msg, runtime_fix(fix_key), location=loc(site), ranks=[r],
                 evidence={"exception": e, "worker": {"pids": list(w.pids), "signal": w.signal,
                                                      "exit_code": w.exit_code},
                           "loader": ld, "surfaced_at": e.location, **step_evidence(ranks)})
