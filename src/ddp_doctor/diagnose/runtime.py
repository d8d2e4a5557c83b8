"""One function per runtime code family: DDP101/102 (steps, sampler), DDP201/202/203 (collectives),
DDP204 (rank exit; DDP501 when restarted ranks cannot connect), DDP205 (stall).
Evidence in, :class:`Finding` objects out."""
from __future__ import annotations

import os
from typing import Any

from ddp_doctor.findings import Finding, Location

LIB_MARKERS = (os.sep + "torch" + os.sep, os.sep + "ddp_doctor" + os.sep, "<frozen", "runpy.py",
               os.sep + "multiprocessing" + os.sep, "threading.py", "selectors.py", "queue.py",
               "connection.py")


# -- helpers ------------------------------------------------------------------------
def loc(site: dict | None) -> Location | None:
    if not site:
        return None
    return Location(site["path"], int(site["line"] or 0), site.get("function"))


def where(site: dict | None) -> str:
    if not site:
        return "an unknown line"
    fn = site.get("function")
    return f"{os.path.basename(site['path'])}:{site['line']}" + (f" ({fn})" if fn and fn != "<module>" else "")


def user_frame(stack: list[dict] | None) -> dict | None:
    """Innermost frame of ``stack`` (outermost first) that is the user's, not a library's."""
    for f in reversed(stack or []):
        if not any(m in f["path"] for m in LIB_MARKERS) and "site-packages" not in f["path"]:
            return f
    return None


def rank_site(st: dict[str, Any]) -> dict | None:
    """Best user line for where a rank is: its collective, its stack, its last sampled line."""
    if (st.get("exit") or {}).get("signal") not in (None, "SIGTERM") and user_frame(st.get("stack")):
        return user_frame(st.get("stack"))  # killed: its published state may be stale, its dump is not
    c = st.get("in_collective") or (st.get("exc") or {}).get("collective")
    if c and c.get("site"):
        return c["site"]
    return user_frame(st.get("stack")) or st.get("where")


def doing(st: dict[str, Any]) -> str:
    """Plain words for what a rank is doing now."""
    ex = st.get("exit") or {}
    if st.get("missing"):
        return "never reported (did not start the probe)"
    if st.get("exc"):
        e = st["exc"]
        c = e.get("collective")
        if c:
            return (f"waited in {c['op']} at {where(c.get('site'))}, then failed with {e['type']}: "
                    f"{_gist(e['message'])} (a consequence)")
        return f"raised {e['type']} at {where(e.get('location'))}"
    if ex.get("signal"):
        return f"was killed by {ex['signal']}"
    if st.get("done") or ex.get("exit_code") == 0:
        return f"finished after {st.get('step', 0)} steps"
    if ex.get("exit_code") not in (None, 0):
        return f"exited with code {ex['exit_code']}"
    c = st.get("in_collective")
    if c:
        return f"waits in {c['op']} (#{c['seq']} on {c['group']}) at {where(c.get('site'))}"
    if st.get("in_data_wait"):
        return f"waits for a batch from its DataLoader at {where(rank_site(st))}"
    return f"is at {where(rank_site(st))}"


def _gist(message: str, limit: int = 160) -> str:
    """The first sentence of an error message, cut at ``limit`` characters."""
    text = " ".join((message or "").split())
    i = text.find(". ")
    text = text[: i + 1] if 0 < i < limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _ranks(ev) -> dict[int, dict[str, Any]]:
    return {int(r): st for r, st in ev.get("ranks", {}).items()}


def _others_text(ranks: dict[int, dict], exclude: set[int]) -> str:
    parts = [f"rank {r} {doing(st)}" for r, st in sorted(ranks.items()) if r not in exclude]
    return "; ".join(parts)


def _step_evidence(ranks) -> dict[str, Any]:
    return {"steps": {str(r): st.get("step") for r, st in ranks.items()},
            "steps_by_epoch": {str(r): st.get("steps_by_epoch") for r, st in ranks.items()},
            "forwards": {str(r): st.get("forwards") for r, st in ranks.items()},
            "epoch": {str(r): st.get("epoch") for r, st in ranks.items()}}


FIX_201 = ("Call the collective on every rank of its group (move it out of the rank-dependent branch), "
           "or make only rank 0 do the work and let the others wait at a barrier every rank reaches, "
           "e.g. `with ddp_doctor.fixes.rank_zero_first(): ...`.")
FIX_202 = ("Do not call the DDP-wrapped model on a subset of ranks: evaluate `model.module` (the unwrapped "
           "model) on rank 0, or run the evaluation on every rank and reduce the metric; "
           "or construct DDP with broadcast_buffers=False if the buffers need no sync.")
FIX_203 = ("Make every rank call the same collectives in the same order with the same shapes and dtypes; "
           "for per-rank variable-size tensors use `ddp_doctor.fixes.gather_variable(...)` "
           "(or all_gather_object) instead of all_gather.")
FIX_101 = ("Make every rank run the same number of steps: agree on skips/early stops with "
           "`ddp_doctor.fixes.agree(flag)` (all_reduce of the decision) or "
           "`ddp_doctor.fixes.skip_if_nonfinite(loss)`; give every rank the same number of batches "
           "with `ddp_doctor.fixes.EvenBatches` / DistributedSampler.")


# -- DDP201 / DDP202 / DDP203 ------------------------------------------------------------
def ddp_forward_sites(st: dict[str, Any]) -> dict[tuple, tuple[dict, int]]:
    """{(file name, line, function): (site, calls)} of the DDP model's forward calls on one rank."""
    sites = st.get("sites") or []
    out = {}
    for op, si, n in st.get("site_counts") or []:
        if op == "ddp.forward" and si is not None and si < len(sites) and sites[si]:
            p, line, fn = sites[si]
            out[(os.path.basename(p), line, fn)] = ({"path": p, "line": line, "function": fn}, n)
    return out


def ddp_subset_forwards(ranks: dict[int, dict]) -> tuple[list[int], dict | None]:
    """Ranks that called the DDP model at a line no other rank ever called it at (and that line)."""
    per = {r: ddp_forward_sites(st) for r, st in ranks.items() if not st.get("missing")}
    if len(per) < 2:
        return [], None
    only: dict[tuple, list[int]] = {}
    fwd = {r: ranks[r].get("forwards") or 0 for r in per}
    for r, sites in per.items():
        for k, (_s, n) in sites.items():
            others = [o for o in per if k not in per[o]]
            # the others must have done at least the forwards this rank did elsewhere (not merely be behind)
            if others and all(fwd[o] > 0 and fwd[o] >= fwd[r] - n for o in others):
                only.setdefault(k, []).append(r)
    if not only:
        return [], None
    # the line run by the fewest ranks, most calls
    k = min(only, key=lambda k: (len(only[k]), -sum(per[r][k][1] for r in only[k])))
    return sorted(only[k]), per[only[k][0]][k][0]


def diagnose_ddp_subset(ev: dict[str, Any]) -> list[Finding]:
    """DDP202 from forward sites alone (for a failed job: a rank ran the DDP model where others never did)."""
    ranks = _ranks(ev)
    subset, site = ddp_subset_forwards(ranks)
    if not subset:
        return []
    fwd = {str(r): st.get("forwards") for r, st in ranks.items()}
    msg = (f"Rank {', '.join(map(str, subset))} called the DDP model at {where(site)}, where the other ranks never "
           f"did (DDP forward calls per rank: {fwd}). Each DDP forward may broadcast buffers (BatchNorm running "
           "stats) and prepares a gradient all-reduce, so these calls pair with the other ranks' unrelated "
           "collectives: a hang or silently mixed training follows.")
    return [Finding("DDP202", msg, FIX_202, location=loc(site), ranks=subset,
                    evidence={"forwards": fwd, **_step_evidence(ranks)})]


def classify_calls(calls: dict[int, dict], ranks: dict[int, dict]) -> tuple[str, list[int], dict | None]:
    """(code, ranks at fault, their site) for ranks that disagree at one collective position."""
    seen = {r: {(op, tuple(s) if s else None) for op, s in (ranks.get(r, {}).get("sites_seen") or [])}
            for r in calls}

    def key(site):
        return (os.path.basename(site["path"]), site["line"], site.get("function")) if site else None

    # a rank killed by a signal published its last state up to 0.25 s before: what it "never ran" is unknown
    reliable = {o for o in calls if (ranks.get(o, {}).get("exit") or {}).get("signal") in (None, "SIGTERM")}

    def unseen_by_others(r, c):
        k = (c["op"], key(c.get("site")))
        others = [o for o in calls if o != r and calls[o] is not None and o in reliable]
        return bool(others) and all(k not in seen[o] for o in others)

    def others_ran_ddp(r):
        # "the DDP model where the others never run it" needs others that did run it: a rank that has not
        # made a single DDP forward yet (stuck in a collective before training) is the odd one out instead
        return all((ranks.get(o, {}).get("forwards") or 0) > 0 for o in calls if o != r and calls[o] is not None)

    subset = [r for r, c in calls.items() if c and c["op"].startswith("ddp.forward") and unseen_by_others(r, c)
              and others_ran_ddp(r)]
    if subset:
        return "DDP202", subset, calls[subset[0]].get("site")
    subset, site = ddp_subset_forwards({r: ranks.get(r, {}) for r in ranks})
    if subset and any(c and c["op"].startswith("ddp.") for c in calls.values()):
        return "DDP202", subset, site
    subset = [r for r, c in calls.items() if c and c["op"].startswith("ddp.") and c["op"] != "ddp.init(broadcast_params)"
              and unseen_by_others(r, c) and others_ran_ddp(r)]
    if subset and len(subset) < len(calls):
        return "DDP202", subset, calls[subset[0]].get("site")
    subset = [r for r, c in calls.items() if c and not c["op"].startswith("ddp.") and unseen_by_others(r, c)]
    if subset and len(subset) < len(calls) and all(not c or c["op"].startswith("ddp.") or r in subset
                                                   for r, c in calls.items()):
        return "DDP201", subset, calls[subset[0]].get("site")
    # same op/site, disagreeing shapes or dtypes; or different ops both sides know
    groups: dict[tuple, list[int]] = {}
    for r, c in calls.items():
        if c:
            groups.setdefault((c["op"], tuple(c.get("shapes") or ()), tuple(c.get("dtypes") or ())), []).append(r)
    sizes = {len(v) for v in groups.values()}
    if len(sizes) == 1:  # no majority to blame: every rank is part of the mismatch
        minority = sorted(r for v in groups.values() for r in v)
    else:
        minority = min(groups.values(), key=len) if groups else []
    site = calls[minority[0]].get("site") if minority else None
    return "DDP203", minority, site


def _finding_for_calls(code: str, at_fault: list[int], site, calls, ranks, group, seq, detected_how: str) -> Finding:
    fault = set(at_fault)
    calls_txt = "; ".join(
        f"rank {r}: {c['op']}{'(' + ', '.join(c['shapes']) + ')' if c.get('shapes') else ''} at {where(c.get('site'))}"
        for r, c in sorted(calls.items()) if c)
    rs = ", ".join(map(str, sorted(fault)))
    if code == "DDP201":
        msg = (f"Rank {rs} called {calls[at_fault[0]]['op']}() at {where(site)}, a line the other ranks never "
               f"reach; {_others_text(ranks, fault)}. {detected_how} (collective #{seq} on {group}: {calls_txt}).")
        fix = FIX_201
    elif code == "DDP202":
        msg = (f"Rank {rs} ran the DDP model at {where(site)}, where the other ranks never do: its DDP "
               f"{'buffer broadcast' if 'forward' in calls[at_fault[0]]['op'] else 'gradient all-reduce'} "
               f"pairs with the others' unrelated collectives; {_others_text(ranks, fault)}. {detected_how} "
               f"(collective #{seq} on {group}: {calls_txt}).")
        fix = FIX_202
    else:
        msg = (f"At collective #{seq} on {group} the ranks disagree: {calls_txt}. gloo/NCCL pair calls by "
               f"position only, so this hangs, crashes or silently mixes data. {detected_how}.")
        fix = FIX_203
    ev = {"group": group, "seq": seq, "calls": {str(r): c for r, c in calls.items()}, **_step_evidence(ranks)}
    return Finding(code, msg, fix, location=loc(site), ranks=sorted(fault), evidence=ev)


def _left_loop_early(ranks, calls, fault, site, lint, group, seq) -> Finding | None:
    """DDP101, not DDP201, when the ranks "calling alone" are in an earlier epoch than the others.

    A collective after the training loop (a final barrier, a metric all_reduce) reached by a rank that
    broke out early (local early stopping) pairs with the others' gradient all-reduces: the collective is
    reached by every rank in the code, the cause is the rank-local exit from the loop.
    """
    eps = {r: c.get("epoch") for r, c in calls.items() if c}
    others = [r for r in eps if r not in fault]
    if not others or any(e is None for e in eps.values()):
        return None
    last, now = max(eps[r] for r in fault), min(eps[o] for o in others)
    if last >= now:
        return None
    # At this instant a rank that left the loop looks like one that has not begun the next epoch yet (an
    # epoch-end barrier under `if rank == 0`): the script decides. Only when lint located a rank-local exit
    # from the loop, and did not flag this collective itself as rank-conditional, is it DDP101.
    location = _lint_line(lint or [], "DDP101", site, (site or {}).get("path"))
    flagged_here = site and any(f.get("code") == "DDP201" and f.get("line") == site.get("line")
                                and os.path.basename(f.get("path") or "") == os.path.basename(site.get("path") or "")
                                for f in lint or [])
    if location is None or flagged_here:
        return None
    rs, os_ = ", ".join(map(str, fault)), ", ".join(map(str, others))
    op = calls[fault[0]]["op"]
    their = "; ".join(f"rank {o}: {calls[o]['op']} at {where(calls[o].get('site'))}" for o in others)
    msg = (f"Rank {rs} left the training loop in epoch {last} while rank {os_} went on training (epoch {now}): "
           f"rank {rs}'s {op}() at {where(site)} paired with the others' training collectives ({their}; "
           f"collective #{seq} on {group}). DDP all-reduces gradients every step, so a rank-local early stop or "
           "`break` leaves the others waiting, or averaging gradients with an unrelated call, until the job hangs "
           "or crashes. Detected as it happened, before any timeout.")
    msg += " The line shown is where ddp-doctor lint located the rank-local exit from the loop."
    return Finding("DDP101", msg, FIX_101, location=loc(location), ranks=sorted(fault),
                   evidence={"group": group, "seq": seq, "calls": {str(r): c for r, c in calls.items()},
                             "epoch_at_collective": {str(r): e for r, e in eps.items()}, **_step_evidence(ranks)})


def diagnose_desync(ev: dict[str, Any], d: dict[str, Any]) -> list[Finding]:
    ranks = _ranks(ev)
    kind = d.get("kind")
    lint = ev.get("lint") or []
    if kind == "steps" and "steps" in d and "calls" not in d:
        return [_uneven_steps(ranks, d["epoch"], {int(k): v for k, v in d["steps"].items()}, "detected as it happened",
                              lint=lint)]
    calls = {int(r): c for r, c in d.get("calls", {}).items()}
    if kind == "steps":
        eps = {r: (c.get("epoch"), c.get("step_in_epoch")) for r, c in calls.items()}
        behind = sorted(calls, key=lambda r: eps[r])
        site = calls[behind[0]].get("site")
        txt = "; ".join(f"rank {r} in epoch {e} after {s} steps" for r, (e, s) in sorted(eps.items()))
        how = (f"collective #{d['seq']} on {d['group']} ({calls[behind[0]]['op']} at {where(site)}) pairs different "
               f"training steps: {txt}; detected as it happened")
        ahead = max(eps.values())  # the rank(s) already in a later epoch ran fewer steps in the earlier one
        fewer = sorted(r for r, e in eps.items() if e == ahead) if len(set(eps.values())) > 1 else sorted(calls)
        epoch = min(e for e, _ in eps.values())
        steps = {r: (st.get("steps_by_epoch") or [0] * (epoch + 1))[epoch] if len(st.get("steps_by_epoch") or []) > epoch
                 else 0 for r, st in ranks.items()}
        f = _uneven_steps(ranks, epoch, steps, how, lint=lint, fallback=fewer, near=site)
        f.evidence.update({"group": d["group"], "seq": d["seq"], "calls": {str(r): c for r, c in calls.items()}})
        return [f]
    code, fault, site = classify_calls(calls, ranks)
    if code == "DDP201":
        early = _left_loop_early(ranks, calls, fault, site, lint, d["group"], d["seq"])
        if early:
            return [early]
    return [_finding_for_calls(code, fault, site, calls, ranks, d["group"], d["seq"],
                               "Detected as it happened, before any timeout")]


def _train_loader(st: dict[str, Any]) -> dict[str, Any]:
    lds = st.get("loaders") or []
    tl = st.get("train_loader")
    return lds[tl] if tl is not None and tl < len(lds) else {}


def _lint_line(lint: list[dict], code: str, near: dict | None, path_hint: str | None) -> dict | None:
    """The lint finding of ``code`` in the user's script nearest to ``near`` (the statically located cause)."""
    base = os.path.basename((near or {}).get("path") or path_hint or "")
    cands = [f for f in lint if f.get("code") == code and (not base or os.path.basename(f["path"]) == base)]
    if not cands:
        return None
    line = (near or {}).get("line") or 0
    best = min(cands, key=lambda f: abs(f["line"] - line))
    return {"path": best["path"], "line": best["line"], "function": None}


def _uneven_steps(ranks, epoch, steps: dict[int, int], how: str, *, lint=None, fallback=None, near=None) -> Finding:
    """DDP101: which ranks are the cause (skipped batches / uneven data / fewer steps) and where."""
    hi = max(steps.values())
    fewer = sorted(r for r, n in steps.items() if n != hi)
    tls = {r: _train_loader(st) for r, st in ranks.items()}
    site = next((t.get("site") for t in tls.values() if t.get("site")), None)
    skips = {r: sum(t.get("skips_by_epoch") or []) for r, t in tls.items()}
    lens = {r: t.get("len") for r, t in tls.items()}
    known = {n for n in lens.values() if isinstance(n, int) and n >= 0}
    first_batches = {r: (t.get("batches_by_epoch") or [None])[0] for r, t in tls.items()
                     if len(t.get("batches_by_epoch") or []) > 1}
    if skips and max(skips.values()) > min(skips.values()):
        cause, culprits = "skip", sorted(r for r, n in skips.items() if n > min(skips.values()))
    elif len(known) > 1 or (len(first_batches) == len(ranks) and len(set(first_batches.values())) > 1):
        cause, culprits = "data", sorted(ranks)
    else:
        cause, culprits = "steps", (fallback or fewer or sorted(steps))
    location = site
    if cause != "data":
        location = _lint_line(lint or [], "DDP101", near or (site and {"path": site["path"], "line": 0}),
                              (site or {}).get("path")) or near or site
    txt = ", ".join(f"rank {r}: {n}" for r, n in sorted(steps.items()))
    why = {"skip": f"rank {', '.join(map(str, culprits))} skipped batches without an optimizer step "
                   f"(skipped per rank: {dict(sorted(skips.items()))})",
           "data": f"the ranks' loaders yield different numbers of batches (len(loader) per rank: "
                   f"{dict(sorted(lens.items()))})",
           "steps": f"rank {', '.join(map(str, culprits))} left the epoch early"}[cause]
    msg = (f"In epoch {epoch} the ranks ran different numbers of optimizer steps ({txt}): {why}. DDP all-reduces "
           "gradients once per step, so the extra steps pair with the other ranks' next ones (gradients of "
           f"different iterations averaged) until the job hangs or crashes; {how}.")
    if cause != "data" and location is not None and location is not site and location is not near:
        msg += " The line shown is where ddp-doctor lint located the rank-local skip."
    return Finding("DDP101", msg, FIX_101, location=loc(location), ranks=culprits,
                   evidence={"epoch": epoch, "steps_in_epoch": {str(r): n for r, n in steps.items()},
                             "cause": cause, "skipped_batches": {str(r): n for r, n in skips.items()},
                             "loader_len": {str(r): n for r, n in lens.items()}, **_step_evidence(ranks)})


def diagnose_steps(ev: dict[str, Any]) -> list[Finding]:
    """DDP101 on a job that ran on: per-epoch (or total) step counts that differ between ranks."""
    ranks = _ranks(ev)
    if len(ranks) < 2 or any(st.get("missing") for st in ranks.values()):
        return []
    counts = {r: st.get("steps_by_epoch") or [] for r, st in ranks.items()}
    n = min(len(c) for c in counts.values())
    for e in range(n):
        vals = {r: c[e] for r, c in counts.items()}
        if len(set(vals.values())) > 1:
            return [_uneven_steps(ranks, e, vals, "the job ran on: its model is silently wrong", lint=ev.get("lint"))]
    totals = {r: st.get("step") or 0 for r, st in ranks.items()}
    if len(set(totals.values())) > 1:
        return [_uneven_steps(ranks, "(all)", totals, "the job ran on: its model is silently wrong", lint=ev.get("lint"))]
    return []


# -- DDP102 --------------------------------------------------------------------------------
def diagnose_sampler(ev: dict[str, Any]) -> list[Finding]:
    out: dict[tuple, Finding] = {}
    for r, st in _ranks(ev).items():
        for ld in st.get("loaders") or []:
            s = ld.get("sampler") or {}
            if s.get("type") != "DistributedSampler" or s.get("shuffle") is False:
                continue
            seen = s.get("epochs_seen") or []
            if len(seen) >= 2 and not s.get("set_epoch_calls") and len(set(seen)) == 1:
                site = ld.get("site")
                key = (site or {}).get("path"), (site or {}).get("line")
                if key in out:
                    out[key].ranks.append(r)
                    continue
                msg = (f"The DataLoader at {where(site)} was iterated for {len(seen)} epochs with a shuffling "
                       f"DistributedSampler whose epoch stayed {seen[0]}: set_epoch() was never called, so every "
                       "epoch sees the same order.")
                out[key] = Finding("DDP102", msg, "Call `sampler.set_epoch(epoch)` at the start of every epoch, "
                                   "before iterating the loader.", location=loc(site), ranks=[r],
                                   evidence={"sampler": s, "epochs": len(seen)})
    return list(out.values())


# -- hang: DDP201/202/203/205 from where the ranks are stuck -----------------------------------
def diagnose_hang(ev: dict[str, Any], d: dict[str, Any]) -> list[Finding]:
    ranks = _ranks(ev)
    live = {r: st for r, st in ranks.items() if not st.get("missing") and not st.get("done")
            and not st.get("exc") and not (st.get("exit") or {})}
    stall = {"stalled_s": d.get("stalled_s"), "hang_limit_s": d.get("limit_s"), "hang_limit_how": d.get("limit_how")}
    in_coll = {r: st["in_collective"] for r, st in live.items() if st.get("in_collective")}
    out_coll = {r: st for r, st in live.items() if r not in in_coll}
    how = f"No rank progressed for {d.get('stalled_s')}s (hang limit {d.get('limit_s')}s)"
    if in_coll and out_coll:
        if all(st.get("in_data_wait") for st in out_coll.values()):
            return [_stall(ranks, out_coll, stall, partial=in_coll)]
        # a subset waits in a collective the others never entered
        calls = dict(in_coll)
        for r, st in out_coll.items():
            calls[r] = None
        by = {}
        for r, c in in_coll.items():
            by.setdefault((c["group"], c["seq"], c["op"]), []).append(r)
        (group, seq, op), subset = max(by.items(), key=lambda kv: len(kv[1]))
        site = in_coll[subset[0]].get("site")
        code = "DDP202" if op.startswith("ddp.forward") else "DDP201"
        fault = set(subset)
        msg = (f"Rank {', '.join(map(str, sorted(fault)))} waits in {op}() at {where(site)} "
               f"(collective #{seq} on {group}), which the other ranks never entered: "
               f"{_others_text(ranks, fault)}. {how}.")
        ev_ = {"group": group, "seq": seq, "in_collective": {str(r): c for r, c in in_coll.items()},
               "where": {str(r): rank_site(st) for r, st in out_coll.items()}, **stall, **_step_evidence(ranks)}
        return [Finding(code, msg, FIX_201 if code == "DDP201" else FIX_202, location=loc(site),
                        ranks=sorted(fault), evidence=ev_)]
    if in_coll:
        keys = {(c["group"], c["seq"], c["op"], tuple(c.get("shapes") or ()), tuple(c.get("dtypes") or ()))
                for c in in_coll.values()}
        if len(keys) > 1:
            calls = {r: c for r, c in in_coll.items()}
            seqs = {c["seq"] for c in calls.values()}
            if len({c["op"] for c in calls.values()}) == 1 and len(seqs) > 1:
                steps = {r: st.get("step") or 0 for r, st in live.items()}
                if len(set(steps.values())) > 1:
                    return [_uneven_steps(ranks, "(all)", steps, how.lower(), lint=ev.get("lint"))]
            code, fault, site = classify_calls(calls, ranks)
            seq = min(c["seq"] for c in calls.values())
            group = next(iter(calls.values()))["group"]
            return [_finding_for_calls(code, fault, site, calls, ranks, group, seq, how)]
        # every live rank waits in the very same collective: someone is missing from it
        gone = {r: st for r, st in ranks.items() if r not in live}
        c = next(iter(in_coll.values()))
        if gone:
            return diagnose_exit(ev, {"reason": "exit", "finished": True})
        msg = (f"Every rank waits inside the same {c['op']} (#{c['seq']} on {c['group']}) at {where(c.get('site'))} "
               f"and it never completes: the transport is stuck (network, a dead peer on another node, GPU). {how}.")
        return [Finding("DDP205", msg, "Check the interconnect and the other nodes' logs; run `ddp-doctor check`.",
                        location=loc(c.get("site")), ranks=sorted(in_coll), evidence={**stall, "collective": c})]
    return [_stall(ranks, live, stall)]


def _stall(ranks, stuck: dict[int, dict], stall: dict, partial: dict | None = None) -> Finding:
    """DDP205: ranks stuck outside collectives (loader, I/O, a lock); show where, and the workers."""
    parts = []
    workers_ev = {}
    for r, st in sorted(stuck.items()):
        txt = f"rank {r} {doing(st)}"
        ws = []
        for w in st.get("workers") or []:
            uf = user_frame(w.get("stack")) or (w.get("stack") or [None])[-1]
            if uf:
                ws.append(f"worker {w['pid']} at {where(uf)}")
            workers_ev[str(w["pid"])] = {"rank": r, "at": uf}
        if ws:
            txt += " (" + "; ".join(ws) + ")"
        parts.append(txt)
    first = min(stuck)
    site = None
    for w in stuck[first].get("workers") or []:
        site = user_frame(w.get("stack"))
        if site:
            break
    site = site or rank_site(stuck[first])
    extra = ""
    if partial:
        extra = " Meanwhile " + "; ".join(f"rank {r} waits in {c['op']} at {where(c.get('site'))}" for r, c in sorted(partial.items())) + "."
    msg = (f"No rank progresses and the stuck ones are not in a collective: {'; '.join(parts)}.{extra} "
           f"Nothing moved for {stall.get('stalled_s')}s.")
    fix = ("Look at the line shown: a DataLoader worker blocked on I/O or a lock, a dataset __getitem__ that never "
           "returns, or a rank waiting on a file/queue another rank never fills. Set DataLoader(timeout=...) so a "
           "stuck worker raises instead of hanging.")
    return Finding("DDP205", msg, fix, location=loc(site), ranks=sorted(stuck),
                   evidence={**stall, "where": {str(r): rank_site(st) for r, st in stuck.items()},
                             "workers": workers_ev, **_step_evidence(ranks)})


# -- DDP204 --------------------------------------------------------------------------------
def _root_ranks(ranks: dict[int, dict]) -> list[int]:
    """The rank(s) whose exit caused the others': an exception outside a collective, then a killing signal,
    then an exception inside a collective (the first one), then a non-zero exit."""
    exc = [r for r, st in ranks.items() if st.get("exc")]
    own = sorted((r for r in exc if not ranks[r]["exc"].get("collective")), key=lambda r: ranks[r]["exc"].get("t") or 0)
    if own:
        first = ranks[own[0]]["exc"]
        key = (first.get("type"), (first.get("location") or {}).get("line"))
        return [r for r in own if (ranks[r]["exc"].get("type"), (ranks[r]["exc"].get("location") or {}).get("line")) == key]
    sig = [r for r, st in ranks.items() if (st.get("exit") or {}).get("signal") not in (None, "SIGTERM")]
    if sig:
        return sorted(sig)
    if exc:
        return sorted(exc, key=lambda r: ranks[r]["exc"].get("t") or 0)[:1]
    bad = [r for r, st in ranks.items() if (st.get("exit") or {}).get("exit_code") not in (None, 0, -15)]
    if bad:
        return sorted(bad)
    return sorted(r for r, st in ranks.items() if (st.get("exit") or {}).get("signal"))


def _finished_early(ranks: dict[int, dict]) -> list[int]:
    """Ranks that ended normally while another was still inside a collective (or failed in one after)."""
    done = [r for r, st in ranks.items() if st.get("done") or (st.get("exit") or {}).get("exit_code") == 0]
    stuck = [r for r, st in ranks.items() if r not in done and (
        st.get("in_collective") or (st.get("exc") or {}).get("collective"))]
    return sorted(done) if done and stuck else []


C10D_MARKERS = (os.sep + "distributed" + os.sep + "distributed_c10d.py", os.sep + "distributed" + os.sep + "c10d_logger.py")


def _fatal_call(st: dict[str, Any]) -> dict | None:
    """{op, site} of the collective a rank was inside when a fatal signal (gloo abort) killed it."""
    if (st.get("exit") or {}).get("signal") not in ("SIGABRT", "SIGSEGV", "SIGBUS"):
        return None
    stack = st.get("stack") or []
    c10d = [f for f in stack if f["path"].endswith(C10D_MARKERS[0])]
    if not c10d:
        return None
    return {"op": c10d[-1]["function"], "shapes": [], "dtypes": [], "site": user_frame(stack), "group": "world",
            "seq": None}


def diagnose_fatal_collective(ev: dict[str, Any]) -> list[Finding]:
    """A rank aborted inside a collective (gloo EnforceNotMet on a mismatch): compare with where the others were."""
    ranks = _ranks(ev)
    calls = {}
    fatal_ops = {c["op"] for c in (_fatal_call(st) for st in ranks.values()) if c}
    for r, st in ranks.items():
        c = _fatal_call(st) or st.get("in_collective") or (st.get("exc") or {}).get("collective")
        if not c and (st.get("last_collective") or {}).get("op") in fatal_ops:
            c = st["last_collective"]  # it got through the same call (gloo paired it), then failed on the result
        if c:
            calls[r] = c
    if not fatal_ops or len(calls) < 2:
        return []
    code, fault, site = classify_calls(calls, ranks)
    f = _finding_for_calls(code, fault, site, calls, ranks, "world", "?",
                           "gloo aborted the process (SIGABRT) on the mismatch")
    return [f]


def finished_case(ranks: dict[int, dict], d: dict[str, Any] | None) -> bool:
    """A rank ended (normally or by sys.exit) while others waited for it, and nothing else failed first."""
    if (d or {}).get("finished"):
        return True
    if not _finished_early(ranks):
        return False
    for st in ranks.values():
        exc = st.get("exc")
        if exc and not exc.get("collective"):
            return False  # a rank raised on its own: that is the story
        if (st.get("exit") or {}).get("signal") not in (None, "SIGTERM"):
            return False  # a rank was killed
    return True


_CONNECT_WORDS = ("connectfullmesh", "connection refused", "failed to connect", "timed out connecting",
                  "connect timeout", "socket timeout", "connection reset")


def diagnose_restart_connect(ev: dict[str, Any]) -> Finding | None:
    """Ranks restarted by torch's agent fail to connect their process group: the stale rendezvous store.

    With ``TORCHELASTIC_USE_AGENT_STORE`` the ranks' process-group keys live in the agent's TCPStore,
    which outlives an attempt; a restarted rank can read a peer's address from the failed attempt and
    connect to a dead port (gloo connectFullMesh / NCCL "connection refused"), so every restart fails.
    When it applies it is the whole story of a failed or hung attempt.
    """
    ranks = _ranks(ev)
    def in_init(frames):
        return any(f.get("function") in ("init_process_group", "new_group", "_new_process_group_helper")
                   for f in frames or [])

    failed, stuck = [], []
    for r, st in ranks.items():
        if not (st.get("attempt") and st.get("agent_store")):
            continue
        e = st.get("exc") or {}
        if e and in_init(e.get("traceback")) and any(w in (e.get("message") or "").lower() for w in _CONNECT_WORDS):
            failed.append(r)
        elif not e and not st.get("exit") and in_init(st.get("stack")):
            stuck.append(r)  # still connecting (to a stale address whose port something else now holds)
    hit = failed or stuck
    if not hit:
        return None
    st0 = ranks[hit[0]]
    attempt = st0["attempt"]
    e = st0.get("exc")
    site = e.get("location") if e else user_frame(st0.get("stack"))
    what = (f"failed to connect the process group at {where(site)}: {e['type']}: {_gist(e['message'], 200)}"
            if e else f"never finished connecting the process group at {where(site)}.")
    msg = (f"torch's agent restarted the job (attempt {attempt}) and rank{'s' if len(hit) > 1 else ''} "
           f"{', '.join(map(str, hit))} then {what} The restarted ranks share the launcher's rendezvous store "
           "(TORCHELASTIC_USE_AGENT_STORE=True), which still holds the failed attempt's connection keys: a rank "
           "can read a dead peer's address and connect to nothing (a known torch issue, pytorch/pytorch#135712). "
           "Every restart can fail this way, so --max-restarts does not help.")
    fix = ("Launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the environment (for `ddp-doctor run` and for "
           "torchrun alike): each attempt then gets a fresh store and the restart connects.")
    return Finding("DDP501", msg, fix, location=loc(site), ranks=hit,
                   evidence={"attempt": attempt, "agent_store": True, **({"exception": e} if e else {})})


def diagnose_exit(ev: dict[str, Any], d: dict[str, Any]) -> list[Finding]:
    ranks = _ranks(ev)
    lint = ev.get("lint") or []
    out: list[Finding] = []
    if finished_case(ranks, d):
        done = sorted(r for r, st in ranks.items() if st.get("done") or (st.get("exit") or {}).get("exit_code") == 0)
        waiting = {r: st for r, st in ranks.items() if r not in done}
        steps = {r: st.get("step") or 0 for r, st in ranks.items()}
        if len(set(steps.values())) <= 1 and waiting:
            msg = (f"Rank {', '.join(map(str, done))} left the training loop and finished after "
                   f"{steps[done[0]]} steps while the others still train: {_others_text(ranks, set(done))}. "
                   "Their next collective has no partner.")
            site = next((rank_site(st) for st in waiting.values() if rank_site(st)), None)
            site = _lint_line(lint, "DDP101", site, None) or site
            out.append(Finding("DDP101", msg, FIX_101, location=loc(site), ranks=done,
                               evidence={"finished": done, **_step_evidence(ranks)}))
        if len(set(steps.values())) > 1:
            counts = {r: st.get("steps_by_epoch") or [] for r, st in ranks.items()}
            n = min((len(c) for c in counts.values()), default=0)
            for e in range(n):
                vals = {r: c[e] for r, c in counts.items()}
                if len(set(vals.values())) > 1:
                    out.append(_uneven_steps(ranks, e, vals, "the rank that ran out of steps finished and the "
                                                              "others wait for it forever", lint=lint))
                    break
            else:
                out.append(_uneven_steps(ranks, "(all)", steps, "the rank with fewer steps finished and the others "
                                                              "wait for it forever", lint=lint))
        site = None
        for st in waiting.values():
            site = rank_site(st)
            if site:
                break
        exit_site = next((ranks[r].get("exit_site") for r in done if ranks[r].get("exit_site")), None)
        if exit_site:
            site = exit_site
        msg = (f"Rank {', '.join(map(str, done))} " + (f"called sys.exit() at {where(exit_site)}" if exit_site else
               "finished") + f" while the others still wait: {_others_text(ranks, set(done))}.")
        out.append(Finding("DDP204", msg, FIX_101 if len(set(steps.values())) > 1 else
                           "Make every rank leave the training loop at the same step (agree on early stops with "
                           "`ddp_doctor.fixes.agree(...)`).",
                           location=loc(site), ranks=done,
                           evidence={"finished": done, "waiting": {str(r): doing(st) for r, st in waiting.items()},
                                     **_step_evidence(ranks)}))
        return out
    roots = _root_ranks(ranks)
    same_exc = [r for r in roots if ranks[r].get("exc")]
    if len(same_exc) > 1:  # every such rank raised the same exception at the same line: one finding
        e = ranks[same_exc[0]]["exc"]
        others = _others_text(ranks, set(same_exc))
        msg = (f"Ranks {', '.join(map(str, same_exc))} raised {e['type']}: {e['message']} at "
               f"{where(e.get('location'))}." + (f" Meanwhile: {others}." if others else ""))
        out.append(Finding("DDP204", msg, "Fix the exception on that line (full traceback in the report's rank "
                           "entries).", location=loc(e.get("location")), ranks=same_exc,
                           evidence={"exception": e, **_step_evidence(ranks)}))
        roots = [r for r in roots if r not in same_exc]
    for r in roots[:4]:
        st = ranks[r]
        ex = st.get("exit") or {}
        others = _others_text(ranks, {r})
        if st.get("exc"):
            e = st["exc"]
            site = e.get("location")
            msg = (f"Rank {r} raised {e['type']}: {e['message']} at {where(site)}. This is the root cause; "
                   f"the launcher's own error may name another rank. Meanwhile: {others}.")
            fix = ("Fix the exception on that line (full traceback in the report's rank entry). If only some ranks "
                   "can hit it (rank-dependent data), make all ranks agree before acting, e.g. "
                   "`ddp_doctor.fixes.agree(flag)`, so they stop together.")
            evidence = {"exception": e, "exit": ex}
        elif ex.get("signal"):
            site = rank_site(st)
            oom = ex["signal"] == "SIGKILL"
            msg = (f"Rank {r} was killed by {ex['signal']}" + (
                " — on Linux almost always the out-of-memory killer (check `dmesg`)" if oom else "") +
                f"; its last line was {where(site)}. Meanwhile: {others}.")
            fix = ("Reduce memory per rank: smaller batch, fewer DataLoader workers / prefetch_factor, load "
                   "checkpoints with map_location (`ddp_doctor.fixes.load_checkpoint`)." if oom else
                   "Find who sent the signal (scheduler preemption, a timeout, a user) or handle it.")
            evidence = {"exit": ex, "last_line": site}
        else:
            site = rank_site(st)
            code = ex.get("exit_code")
            msg = f"Rank {r} exited with code {code} at {where(site)} while the job was running. Meanwhile: {others}."
            fix = "Find why the rank called exit (sys.exit / os._exit) and make every rank stop together."
            evidence = {"exit": ex}
        out.append(Finding("DDP204", msg, fix, location=loc(site), ranks=[r],
                           evidence={**evidence, **_step_evidence(ranks)}))
    if not out:
        out.append(Finding("DDP204", "A rank exited while the others were running (no detail was captured).",
                           "Look at the ranks' stderr.", ranks=[], evidence=_step_evidence(ranks)))
    return out
