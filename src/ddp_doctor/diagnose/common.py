"""What every runtime code family shares: plain words for where a rank is and what it does, the user's
frame of a stack, the evidence every step-related finding carries, the fix texts several codes give."""
from __future__ import annotations

import os
from typing import Any

from ddp_doctor.findings import Location

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
                    f"{gist(e['message'])} (a consequence)")
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


def gist(message: str, limit: int = 160) -> str:
    """The first sentence of an error message, cut at ``limit`` characters."""
    text = " ".join((message or "").split())
    i = text.find(". ")
    text = text[: i + 1] if 0 < i < limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ranks_of(ev) -> dict[int, dict[str, Any]]:
    return {int(r): st for r, st in ev.get("ranks", {}).items()}


def others_text(ranks: dict[int, dict], exclude: set[int]) -> str:
    parts = [f"rank {r} {doing(st)}" for r, st in sorted(ranks.items()) if r not in exclude]
    return "; ".join(parts)


def step_evidence(ranks) -> dict[str, Any]:
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



def lint_line(lint: list[dict], code: str, near: dict | None, path_hint: str | None) -> dict | None:
    """The lint finding of ``code`` in the user's script nearest to ``near`` (the statically located cause)."""
    base = os.path.basename((near or {}).get("path") or path_hint or "")
    cands = [f for f in lint if f.get("code") == code and (not base or os.path.basename(f["path"]) == base)]
    if not cands:
        return None
    line = (near or {}).get("line") or 0
    best = min(cands, key=lambda f: abs(f["line"] - line))
    return {"path": best["path"], "line": best["line"], "function": None}


