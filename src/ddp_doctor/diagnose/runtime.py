"""One function per runtime code family: DDP101/102 (steps, sampler), DDP201/202/203 (collectives),
DDP204 (rank exit), DDP205 (stall).  Evidence in, :class:`Finding` objects out."""
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
                    f"{e['message'][:120]} (a consequence)")
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
def classify_calls(calls: dict[int, dict], ranks: dict[int, dict]) -> tuple[str, list[int], dict | None]:
    """(code, ranks at fault, their site) for ranks that disagree at one collective position."""
    seen = {r: {(op, tuple(s) if s else None) for op, s in (ranks.get(r, {}).get("sites_seen") or [])}
            for r in calls}

    def key(site):
        return (os.path.basename(site["path"]), site["line"], site.get("function")) if site else None

    def unseen_by_others(r, c):
        k = (c["op"], key(c.get("site")))
        return all(k not in seen[o] for o in calls if o != r and calls[o] is not None) if len(calls) > 1 else False

    subset = [r for r, c in calls.items() if c and c["op"].startswith("ddp.forward") and unseen_by_others(r, c)]
    if subset:
        return "DDP202", subset, calls[subset[0]].get("site")
    subset = [r for r, c in calls.items() if c and c["op"].startswith("ddp.") and c["op"] != "ddp.init(broadcast_params)"
              and unseen_by_others(r, c)]
    if subset and len(subset) < len(calls):
        return "DDP202", subset, calls[subset[0]].get("site")
    subset = [r for r, c in calls.items() if c and not c["op"].startswith("ddp.") and unseen_by_others(r, c)]
    if subset and len(subset) < len(calls):
        return "DDP201", subset, calls[subset[0]].get("site")
    # same op/site, disagreeing shapes or dtypes; or different ops both sides know
    groups: dict[tuple, list[int]] = {}
    for r, c in calls.items():
        if c:
            groups.setdefault((c["op"], tuple(c.get("shapes") or ()), tuple(c.get("dtypes") or ())), []).append(r)
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


def diagnose_desync(ev: dict[str, Any], d: dict[str, Any]) -> list[Finding]:
    ranks = _ranks(ev)
    kind = d.get("kind")
    if kind == "steps" and "steps" in d and "calls" not in d:
        return [_uneven_steps(ranks, d["epoch"], {int(k): v for k, v in d["steps"].items()}, "detected as it happened")]
    calls = {int(r): c for r, c in d.get("calls", {}).items()}
    if kind == "steps":
        eps = {r: (c.get("epoch"), c.get("step_in_epoch")) for r, c in calls.items()}
        behind = sorted(calls, key=lambda r: eps[r])
        site = calls[behind[0]].get("site")
        txt = "; ".join(f"rank {r} in epoch {e} after {s} steps" for r, (e, s) in sorted(eps.items()))
        msg = (f"The ranks' collective #{d['seq']} on {d['group']} ({calls[behind[0]]['op']} at {where(site)}) "
               f"pairs different training steps: {txt}. One rank ran more steps than another in an epoch, and the "
               "gradient all-reduces now average different iterations (gloo pairs them silently); the job hangs or "
               "crashes later. Detected as it happened.")
        ahead = max(eps.values())  # the rank(s) already in a later epoch ran fewer steps in the earlier one
        fewer = sorted(r for r, e in eps.items() if e == ahead) if len(set(eps.values())) > 1 else sorted(calls)
        return [Finding("DDP101", msg, FIX_101, location=loc(site), ranks=fewer,
                        evidence={"group": d["group"], "seq": d["seq"], "calls": {str(r): c for r, c in calls.items()},
                                  **_step_evidence(ranks)})]
    code, fault, site = classify_calls(calls, ranks)
    return [_finding_for_calls(code, fault, site, calls, ranks, d["group"], d["seq"],
                               "Detected as it happened, before any timeout")]


def _uneven_steps(ranks, epoch, steps: dict[int, int], how: str) -> Finding:
    hi = max(steps.values())
    fewer = sorted(r for r, n in steps.items() if n != hi)
    site = None
    for st in ranks.values():
        tl = st.get("train_loader")
        if tl is not None and st.get("loaders"):
            site = st["loaders"][tl].get("site")
            break
    lens = {str(r): (st.get("loaders") or [{}])[st.get("train_loader") or 0].get("len") if st.get("loaders") else None
            for r, st in ranks.items()}
    txt = ", ".join(f"rank {r}: {n}" for r, n in sorted(steps.items()))
    msg = (f"In epoch {epoch} the ranks ran different numbers of optimizer steps ({txt}); len(loader) per rank: "
           f"{lens}. DDP all-reduces gradients once per step, so the extra steps pair with the next epoch's "
           f"(gradients of different iterations averaged) until the job hangs or crashes; {how}.")
    return Finding("DDP101", msg, FIX_101, location=loc(site), ranks=fewer or sorted(steps),
                   evidence={"epoch": epoch, "steps_in_epoch": {str(r): n for r, n in steps.items()},
                             "loader_len": lens, **_step_evidence(ranks)})


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
            return [_uneven_steps(ranks, e, vals, "the job ran on: its model is silently wrong")]
    totals = {r: st.get("step") or 0 for r, st in ranks.items()}
    if len(set(totals.values())) > 1:
        return [_uneven_steps(ranks, "(all)", totals, "the job ran on: its model is silently wrong")]
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
                    return [_uneven_steps(ranks, "(all)", steps, how.lower())]
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
        return own[:1]
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


def diagnose_exit(ev: dict[str, Any], d: dict[str, Any]) -> list[Finding]:
    ranks = _ranks(ev)
    out: list[Finding] = []
    if d.get("finished") or (_finished_early(ranks) and not [
            r for r in _root_ranks(ranks) if not (ranks[r].get("exc") or {}).get("collective")]):
        done = sorted(r for r, st in ranks.items() if st.get("done") or (st.get("exit") or {}).get("exit_code") == 0)
        waiting = {r: st for r, st in ranks.items() if r not in done}
        steps = {r: st.get("step") or 0 for r, st in ranks.items()}
        if len(set(steps.values())) <= 1 and waiting:
            msg = (f"Rank {', '.join(map(str, done))} left the training loop and finished after "
                   f"{steps[done[0]]} steps while the others still train: {_others_text(ranks, set(done))}. "
                   "Their next collective has no partner.")
            site = next((rank_site(st) for st in waiting.values() if rank_site(st)), None)
            out.append(Finding("DDP101", msg, FIX_101, location=loc(site), ranks=done,
                               evidence={"finished": done, **_step_evidence(ranks)}))
        if len(set(steps.values())) > 1:
            counts = {r: st.get("steps_by_epoch") or [] for r, st in ranks.items()}
            n = min((len(c) for c in counts.values()), default=0)
            for e in range(n):
                vals = {r: c[e] for r, c in counts.items()}
                if len(set(vals.values())) > 1:
                    out.append(_uneven_steps(ranks, e, vals, "the rank that ran out of steps finished and the "
                                                              "others wait for it forever"))
                    break
            else:
                out.append(_uneven_steps(ranks, "(all)", steps, "the rank with fewer steps finished and the others "
                                                              "wait for it forever"))
        site = None
        for st in waiting.values():
            site = rank_site(st)
            if site:
                break
        msg = (f"Rank {', '.join(map(str, done))} finished while the others still wait: {_others_text(ranks, set(done))}.")
        out.append(Finding("DDP204", msg, FIX_101 if len(set(steps.values())) > 1 else
                           "Make every rank leave the training loop at the same step (agree on early stops with "
                           "`ddp_doctor.fixes.agree(...)`).",
                           location=loc(site), ranks=done,
                           evidence={"finished": done, "waiting": {str(r): doing(st) for r, st in waiting.items()},
                                     **_step_evidence(ranks)}))
        return out
    for r in _root_ranks(ranks)[:4]:
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
