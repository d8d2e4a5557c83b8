"""Runtime performance diagnoses: evidence -> findings (DDP401, DDP403, DDP404, DDP405, DDP301/302).

Pure functions: no I/O, no formatting, no torch.  ``evidence`` is the watcher's
plain-data view of every rank (``JobEvidence.to_json()``, :mod:`ddp_doctor.evidence`); optional
extras are used when present:

- ``evidence["machine"] = {"cpu_count": int}`` (else ``os.cpu_count()`` of the
  process that diagnoses: the launcher runs on the ranks' node);
- ``evidence["gpu"]``: an NVML snapshot from :func:`ddp_doctor.gpu.snapshot`,
  with the ranks' ``cuda`` / ``loads`` records from ``probe/perf.py``.

DDP102 at runtime is diagnosed by ``diagnose.steps`` (one place per code).
"""
from __future__ import annotations

import os
import statistics
from typing import Any

from ddp_doctor.diagnose.gpu_memory import diagnose_gpu_memory
from ddp_doctor.diagnose.perfwire import wire_loc, wire_ranks, wire_where
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.findings import runtime_fix

# thresholds (documented in docs/perf.md)
DATA_SHARE = 0.30          # DDP401: data wait >= 30% of the step time ...
DATA_MIN_S = 0.005         # ... and >= 5 ms per step
MIN_STEPS = 5              # fewer measured steps: no performance judgement
STRAGGLER_RATIO = 1.25     # DDP404: busy time >= 1.25x the other ranks' ...
STRAGGLER_MIN_S = 0.005    # ... and >= 5 ms more per step ...
STRAGGLER_CONSISTENCY = 0.7  # ... in >= 70% of the steps compared
RESTART_MIN_S = 0.05       # DDP403: first batch of an epoch >= 50 ms slower than a steady batch ...
RESTART_FACTOR = 3.0       # ... and >= 3x a steady batch
PHASES = ("step_s", "data_s", "compute_s", "collective_s")
UNUSED_MIN_STEPS = 3       # DDP405: judge find_unused_parameters after this many backward passes


def diagnose_perf(evidence: dict[str, Any]) -> list[Draft]:
    """All performance findings for a job (most important first)."""
    out: list[Draft] = []
    out += diagnose_data_bound(evidence)
    out += diagnose_straggler(evidence, data_bound={r for f in out for r in f.ranks})
    out += diagnose_worker_restarts(evidence)
    out += diagnose_unused_parameters(evidence)
    out += diagnose_gpu_memory(evidence)
    return out


# -- helpers ----------------------------------------------------------------------------------
def _ms(s: float) -> str:
    return f"{s * 1000:.0f} ms" if s < 10 else f"{s:.1f} s"


def _ranks_str(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, sorted(ranks)))


def _median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else 0.0


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def train_loader(st: dict[str, Any]) -> dict[str, Any] | None:
    """The rank's training loader: the one the probe marked, else the one with most batches."""
    loaders = st.get("loaders") or []
    idx = st.get("train_loader")
    if isinstance(idx, int) and 0 <= idx < len(loaders):
        return loaders[idx]
    return max(loaders, key=lambda ld: ld.get("batches") or 0) if loaders else None


def step_phases(st: dict[str, Any]) -> list[dict[str, float]]:
    """Per-step split {"step", "data", "collective", "busy", "compute"} (seconds) from the rank's timeline.

    A step interval runs from one optimizer step to the next; the data waits and
    collective waits that *start* inside it are its data and collective time;
    busy = step - collective (the time the rank itself needs), compute = busy - data;
    epoch_start marks the steps that include an ``iter(loader)`` (worker start-up, DDP403).
    Empty when the timeline has no step events.
    """
    tl = st.get("timeline") or []
    steps = [e for e in tl if e.get("kind") == "step" and (e.get("dur") or 0) > 0]
    if not steps:
        return []
    others = sorted((e for e in tl if e.get("kind") in ("data_wait", "collective", "h2d")), key=lambda e: e["t"])
    epochs = sorted(e["t"] for e in tl if e.get("kind") == "epoch")
    out = []
    j = 0
    for s in sorted(steps, key=lambda e: e["t"]):
        t0, t1 = s["t"], s["t"] + s["dur"]
        while j < len(others) and others[j]["t"] < t0:
            j += 1
        data = coll = h2d = 0.0
        k = j
        while k < len(others) and others[k]["t"] < t1:
            kind = others[k]["kind"]
            if kind == "data_wait":
                data += others[k]["dur"]
            elif kind == "h2d":
                h2d += others[k]["dur"]
            else:
                coll += others[k]["dur"]
            k += 1
        dur = s["dur"]
        coll = min(coll, dur)
        data = min(data, dur - coll)
        h2d = min(h2d, dur - coll - data)
        out.append({"label": s.get("label"), "step": dur, "data": data, "collective": coll, "h2d": h2d,
                    "busy": dur - coll, "compute": max(0.0, dur - coll - data - h2d),
                    "epoch_start": any(t0 <= te < t1 for te in epochs)})
    return out


def rank_split(st: dict[str, Any]) -> dict[str, Any] | None:
    """Mean per-step seconds of a rank: step, data, collective, compute (+ how many steps it rests on).

    Uses the per-step timeline when there is one (same window for every phase),
    else the last step intervals with the train loader's last batch waits, else
    the totals.
    """
    phases = step_phases(st)
    if len(phases) >= MIN_STEPS:
        n = len(phases)
        step = _mean([p["step"] for p in phases])
        data = _mean([p["data"] for p in phases])
        coll = _mean([p["collective"] for p in phases])
        h2d = _mean([p.get("h2d", 0.0) for p in phases])
        steady = [p for p in phases if not p.get("epoch_start")]
        if len(steady) < MIN_STEPS:
            steady = phases
        return {"steps": n, "step_s": step, "data_s": data, "collective_s": coll, "h2d_s": h2d,
                "compute_s": max(0.0, step - data - coll - h2d), "source": "timeline",
                "steady_step_s": _mean([p["step"] for p in steady]),
                "steady_data_s": _mean([p["data"] for p in steady]),
                "epoch_start_steps": n - len(steady) if steady is not phases else 0}
    times = [float(x) for x in (st.get("step_times") or [])]
    ld = train_loader(st)
    waits = [float(x) for x in ((ld or {}).get("batch_wait_s") or [])]
    tm = st.get("timing") or {}
    if len(times) >= MIN_STEPS and waits:
        n = min(len(times), len(waits))
        step = _mean(times[-n:])
        data = min(_mean(waits[-n:]), step)
        steps_total = tm.get("steps") or 0
        coll = (tm.get("collective_s") or 0.0) / steps_total if steps_total else 0.0
        coll = min(coll, step - data)
        return {"steps": n, "step_s": step, "data_s": data, "collective_s": coll,
                "compute_s": max(0.0, step - data - coll), "source": "recent"}
    n = tm.get("steps") or 0
    if n >= MIN_STEPS and tm.get("step_time_s"):
        step = tm["step_time_s"] / n
        data = min((tm.get("data_wait_s") or 0.0) / n, step)
        coll = min((tm.get("collective_s") or 0.0) / n, step - data)
        return {"steps": n, "step_s": step, "data_s": data, "collective_s": coll,
                "compute_s": max(0.0, step - data - coll), "source": "totals"}
    return None


def _cpu_count(ev: dict[str, Any], ranks: dict[int, dict[str, Any]] | None = None) -> int:
    """CPUs of the ranks' node: what the probe saw (cpuset-aware), else evidence["machine"], else this machine."""
    seen = [int(st["cpu_count"]) for st in (ranks or {}).values() if st.get("cpu_count")]
    if seen:
        return min(seen)
    m = ev.get("machine") or {}
    return int(m.get("cpu_count") or os.cpu_count() or 1)


def _overload(ev: dict[str, Any], ranks: dict[int, dict[str, Any]], cpus: int) -> float | None:
    """1-minute load average of the node when it exceeded 1.5x its CPUs (other processes competing), else None."""
    loads = [(ev.get("machine") or {}).get("loadavg")] + [st.get("loadavg") for st in ranks.values()]
    vals = [float(x[0]) for x in loads if x]
    if vals and max(vals) > 1.5 * cpus:
        return max(vals)
    return None


def _ranks_per_host(ranks: dict[int, dict[str, Any]]) -> int:
    hosts: dict[str, int] = {}
    for st in ranks.values():
        h = st.get("host") or "?"
        hosts[h] = hosts.get(h, 0) + 1
    return max(hosts.values()) if hosts else 1


def _settings(ld: dict[str, Any]) -> dict[str, Any]:
    return {k: ld.get(k) for k in ("num_workers", "pin_memory", "persistent_workers", "prefetch_factor", "batch_size")}


def _settings_str(s: dict[str, Any]) -> str:
    return ", ".join(f"{k}={s[k]!r}" for k in s)


# -- DDP401 data-bound ------------------------------------------------------------------------
def _split_str(sp: dict[str, Any]) -> str:
    """'data 60% / compute 30% / collective 10%' (with the host-to-device copy when it was measured)."""
    step = sp["step_s"] or 1e-9
    parts = [("data", sp["data_s"])]
    if sp.get("h2d_s"):
        parts.append(("host-to-device copy", sp["h2d_s"]))
    parts += [("compute", sp["compute_s"]), ("collective", sp["collective_s"])]
    return " / ".join(f"{name} {v / step:.0%}" for name, v in parts)


def recommend_workers(cpu_count: int, ranks_per_node: int) -> int:
    """Workers per rank that fit the machine: the CPUs per rank minus one for the training process, 1..8."""
    per_rank = max(1, cpu_count // max(1, ranks_per_node))
    return max(1, min(8, per_rank - 1 if per_rank > 1 else 1))


def diagnose_data_bound(ev: dict[str, Any]) -> list[Draft]:
    ranks = wire_ranks(ev)
    splits = {r: rank_split(st) for r, st in ranks.items()}
    bound = {}
    for r, sp in splits.items():
        if sp and sp["step_s"] > 0:
            share = sp["data_s"] / sp["step_s"]
            # judged on the steady steps: the first batch of each epoch (worker start-up) is DDP403's
            s_step, s_data = sp.get("steady_step_s", sp["step_s"]), sp.get("steady_data_s", sp["data_s"])
            if share >= DATA_SHARE and s_step > 0 and s_data / s_step >= DATA_SHARE and s_data >= DATA_MIN_S:
                bound[r] = share
    if not bound:
        return []
    cpus = _cpu_count(ev, ranks)
    per_node = _ranks_per_host(ranks)
    # one finding per DataLoader site
    groups: dict[tuple, list[int]] = {}
    for r in bound:
        ld = train_loader(ranks[r]) or {}
        site = ld.get("site") or {}
        groups.setdefault((site.get("path"), site.get("line")), []).append(r)
    out = []
    for _key, rs in groups.items():
        r0 = max(rs, key=lambda r: bound[r])
        ld = train_loader(ranks[r0]) or {}
        settings = _settings(ld)
        sp = splits[r0]
        share = bound[r0]
        nw = int(settings.get("num_workers") or 0)
        rec_w = recommend_workers(cpus, per_node)
        data, step = sp["data_s"], sp["step_s"]
        other = max(step - data, 1e-9)
        split = ", ".join(f"rank {r}: {_split_str(splits[r])}" for r in sorted(rs))
        verb = "spends" if len(rs) == 1 else "spend"
        msg = (f"{_ranks_str(rs)} {verb} {share:.0%} of each training step waiting for the next batch "
               f"({_ms(data)} of {_ms(step)} per step, over {sp['steps']} steps) from the DataLoader at "
               f"{wire_where(ld.get('site'))} ({_settings_str(settings)}). The GPU idles meanwhile, and every other "
               f"rank waits for the slowest loader at each all-reduce. Per-step split: {split}.")
        overload = _overload(ev, ranks, cpus)
        if overload is not None:
            msg += (f" The node was oversubscribed while it ran (load average {overload:.1f} on {cpus} CPUs): part of "
                    "this wait is other processes taking the CPUs the loader needs.")
        fix_parts = []
        if nw < rec_w:
            # with W workers loading in parallel, a batch costs about (load time)/W of wall time
            load = data if nw == 0 else data * max(nw, 1)
            expect = max(0.0, load / rec_w - other)
            fix_parts.append(
                f"Set num_workers={rec_w} (this machine: {cpus} CPUs for {per_node} rank(s) per node, so about "
                f"{max(1, cpus // max(1, per_node))} per rank, one kept for the training process); expected data "
                f"wait about {_ms(expect)} per step instead of {_ms(data)}.")
            if not settings.get("persistent_workers"):
                fix_parts.append("Add persistent_workers=True so the workers survive between epochs.")
        else:
            fix_parts.append(
                f"num_workers={nw} already uses this machine's CPU budget ({cpus} CPUs for {per_node} rank(s) per "
                "node): the loader is CPU-bound. Make each sample cheaper (cache decoded/preprocessed data, "
                "move augmentation to the GPU, use a faster decoder) or give the job more CPUs.")
        if not settings.get("pin_memory"):
            fix_parts.append("On GPU, add pin_memory=True and overlap the copy with "
                             "ddp_doctor.fixes.CUDAPrefetcher(loader, device).")
        out.append(Draft(
            "DDP401", msg, " ".join(fix_parts), location=wire_loc(ld.get("site")), ranks=sorted(rs),
            evidence={"share": {r: round(bound[r], 3) for r in sorted(rs)},
                      "per_step_s": {r: {k: round(splits[r][k], 5) for k in PHASES} for r in sorted(rs)},
                      "steps": sp["steps"], "source": sp["source"], "loader": settings,
                      "cpu_count": cpus, "ranks_per_node": per_node, "overloaded_load": overload,
                      "recommended_num_workers": rec_w,
                      "h2d_copy_s": ({r: round(splits[r].get("h2d_s", 0.0), 5) for r in sorted(rs)}
                                     if any(st.get("h2d") for st in ranks.values()) else "not measured (no CUDA)")},
        ))
    return out


# -- DDP404 straggler -------------------------------------------------------------------------
def diagnose_straggler(ev: dict[str, Any], data_bound: set[int] = frozenset()) -> list[Draft]:
    """DDP404: one rank's own work is consistently slower.  ``data_bound``: the ranks DDP401 found waiting on
    their loader; when that is every rank, a slower loader is DDP401's story, not a straggler rank."""
    ranks = wire_ranks(ev)
    if len(ranks) < 2:
        return []
    phases = {r: step_phases(st) for r, st in ranks.items()}
    busy: dict[int, float] = {}
    data: dict[int, float] = {}
    comp: dict[int, float] = {}
    coll: dict[int, float] = {}
    per_step: dict[int, dict[Any, float]] = {}
    for r, ph in phases.items():
        ph = ph[1:] if len(ph) > MIN_STEPS else ph  # the first interval holds start-up work
        if len(ph) >= MIN_STEPS:
            busy[r] = _median([p["busy"] for p in ph])
            data[r] = _median([p["data"] for p in ph])
            comp[r] = _median([p["compute"] for p in ph])
            coll[r] = _median([p["collective"] for p in ph])
            per_step[r] = {p["label"]: p["busy"] for p in ph}
        else:
            sp = rank_split(ranks[r])
            if sp is None:
                continue
            busy[r] = sp["step_s"] - sp["collective_s"]
            data[r], comp[r], coll[r] = sp["data_s"], sp["compute_s"], sp["collective_s"]
    if len(busy) < 2:
        return []
    slow = max(busy, key=busy.get)
    others = [r for r in busy if r != slow]
    ref = _median([busy[r] for r in others])
    if ref <= 0 or busy[slow] < STRAGGLER_RATIO * ref or busy[slow] - ref < STRAGGLER_MIN_S:
        return []
    # consistency: per aligned step, the slow rank's busy time above every other rank's
    compared = above = 0
    if slow in per_step and all(r in per_step for r in others):
        for label, b in per_step[slow].items():
            vals = [per_step[r].get(label) for r in others]
            if label is None or any(v is None for v in vals):
                continue
            compared += 1
            above += b > max(vals)
    consistency = above / compared if compared else None
    if consistency is not None and consistency < STRAGGLER_CONSISTENCY:
        return []
    d_data = data[slow] - _median([data[r] for r in others])
    d_comp = comp[slow] - _median([comp[r] for r in others])
    phase = "data loading" if d_data > d_comp else "compute (forward/backward/optimizer)"
    if phase == "data loading" and data_bound and data_bound >= set(ranks):
        return []
    excess = max(d_data, d_comp)
    wait_others = _median([coll[r] for r in others])
    host = ranks[slow].get("host")
    how_often = f" in {above} of {compared} steps" if compared else ""
    msg = (f"rank {slow}{' on ' + host if host else ''} is a straggler: its own work takes {_ms(busy[slow])} per "
           f"step vs {_ms(ref)} on the other ranks (x{busy[slow] / ref:.1f}{how_often}). The extra time is in "
           f"{phase} (+{_ms(excess)} per step: data {_ms(data[slow])} vs {_ms(_median([data[r] for r in others]))}, "
           f"compute {_ms(comp[slow])} vs {_ms(_median([comp[r] for r in others]))}); the other ranks wait for it "
           f"in the gradient all-reduce ({_ms(wait_others)} per step).")
    if phase == "data loading":
        ld = train_loader(ranks[slow]) or {}
        fix = (f"Rank {slow}'s loader is slower than the others' (DataLoader at {wire_where(ld.get('site'))}, "
               f"{_settings_str(_settings(ld))}): check its data shard (larger or slower files, remote storage) "
               "and give the loader more workers.")
        loc = wire_loc(ld.get("site"))
    else:
        fix = (f"Find why rank {slow} computes slower: another process on its GPU/CPU (nvidia-smi, top), a slower "
               "or throttled device, CPU threads oversubscribed (set OMP_NUM_THREADS per rank), or rank-dependent "
               "work (larger inputs, extra logging/eval on that rank).")
        loc = None
    return [Draft("DDP404", msg, fix, location=loc, ranks=[slow], evidence={
        "busy_s": {r: round(v, 5) for r, v in busy.items()}, "data_s": {r: round(v, 5) for r, v in data.items()},
        "compute_s": {r: round(v, 5) for r, v in comp.items()},
        "collective_s": {r: round(v, 5) for r, v in coll.items()},
        "ratio": round(busy[slow] / ref, 3), "phase": "data" if phase == "data loading" else "compute",
        "consistency": None if consistency is None else round(consistency, 3), "steps_compared": compared})]


# -- DDP403 workers restarted every epoch ------------------------------------------------------
def diagnose_worker_restarts(ev: dict[str, Any]) -> list[Draft]:
    ranks = wire_ranks(ev)
    groups: dict[tuple, dict[str, Any]] = {}
    for r, st in ranks.items():
        for ld in st.get("loaders") or []:
            nw = ld.get("num_workers") or 0
            starts = [float(x) for x in (ld.get("epoch_start_s") or [])]
            if nw <= 0 or ld.get("persistent_workers") or len(starts) < 2:
                continue
            waits = [float(x) for x in (ld.get("batch_wait_s") or [])]
            steady = _median(sorted(waits)[: max(1, len(waits) * 3 // 4)]) if waits else 0.0
            startup = _median(starts)  # per epoch (the first epoch is a start-up anyone pays)
            cost = startup - steady
            if cost < RESTART_MIN_S or startup < RESTART_FACTOR * max(steady, 1e-6):
                continue
            site = ld.get("site") or {}
            key = (site.get("path"), site.get("line"))
            g = groups.setdefault(key, {"ranks": [], "ld": ld, "startup": [], "steady": [], "epochs": 0})
            g["ranks"].append(r)
            g["startup"].append(startup)
            g["steady"].append(steady)
            g["epochs"] = max(g["epochs"], len(starts))
    out = []
    for g in groups.values():
        ld = g["ld"]
        startup = _median(g["startup"])
        steady = _median(g["steady"])
        wasted = (startup - steady) * max(0, g["epochs"] - 1)
        msg = (f"The DataLoader at {wire_where(ld.get('site'))} (num_workers={ld.get('num_workers')}, "
               f"persistent_workers=False) starts its {ld.get('num_workers')} worker processes again every epoch: "
               f"the first batch of an epoch takes {_ms(startup)} against {_ms(steady)} for a steady batch, on "
               f"{_ranks_str(g['ranks'])} -- about {_ms(wasted)} lost over {g['epochs']} epochs (each epoch also "
               "re-imports and re-builds whatever the dataset does at worker start).")
        out.append(Draft(
            "DDP403", msg, runtime_fix("DDP403"),
            location=wire_loc(ld.get("site")), ranks=sorted(g["ranks"]),
            evidence={"epoch_start_s": round(startup, 4), "steady_batch_s": round(steady, 5),
                      "epochs": g["epochs"], "wasted_s": round(wasted, 3), "num_workers": ld.get("num_workers")}))
    return out


# -- DDP405 find_unused_parameters=True, none unused ------------------------------------------
def diagnose_unused_parameters(ev: dict[str, Any]) -> list[Draft]:
    ranks = wire_ranks(ev)
    sites: dict[tuple, dict[str, Any]] = {}
    for r, st in ranks.items():
        if (st.get("backwards") or 0) < UNUSED_MIN_STEPS:
            continue
        for d in st.get("ddp") or []:
            if not d.get("find_unused_parameters"):
                continue
            site = d.get("site") or {}
            key = (site.get("path"), site.get("line"))
            g = sites.setdefault(key, {"ranks": [], "seen": False, "unknown": False, "d": d})
            g["ranks"].append(r)
            if d.get("unused_seen") is None:
                g["unknown"] = True
            elif d.get("unused_seen"):
                g["seen"] = True
    out = []
    for g in sites.values():
        if g["seen"] or g["unknown"]:
            continue  # a parameter was unused on some rank: the flag is needed
        d = g["d"]
        msg = (f"The DDP model built at {wire_where(d.get('site'))} has find_unused_parameters=True, but no rank "
               f"ever had an unused parameter ({_ranks_str(g['ranks'])} checked, {d.get('params')} parameters): "
               "every backward pass pays an extra traversal of the autograd graph for nothing.")
        out.append(Draft(
            "DDP405", msg, runtime_fix("DDP405"),
            location=wire_loc(d.get("site")), ranks=sorted(g["ranks"]),
            evidence={"params": d.get("params"), "unused_parameter_size": d.get("unused_parameter_size", 0)}))
    return out
