"""What every runtime code family shares: plain words for where a rank is and what it does, the user's
frame of a stack, the evidence every step-related finding carries, the fix texts several codes give."""
from __future__ import annotations

import os
from typing import Any

from ddp_doctor.evidence import ExitStatus, JobEvidence, OutsideWait, RankState, Site, rank_runs
from ddp_doctor.findings import ENDED_EARLY, STEP_FAMILY, Location, runtime_fix
from ddp_doctor.frames import LIBRARY, innermost_user, kind

# -- helpers ------------------------------------------------------------------------
def loc(site: Site | None) -> Location | None:
    if not site:
        return None
    return Location(site.path, int(site.line or 0), site.function)


def where(site: Site | None) -> str:
    if not site:
        return "an unknown line"
    fn = site.function
    return f"{os.path.basename(site.path)}:{site.line}" + (f" ({fn})" if fn and fn != "<module>" else "")


def user_frame(stack) -> Site | None:
    """Innermost frame of ``stack`` (outermost first) that is the user's, not a library's."""
    return innermost_user(stack)


def rank_site(st: RankState) -> Site | None:
    """Best user line for where a rank is: its collective, its stack, its last sampled line."""
    if st.exit and st.exit.killed and user_frame(st.stack):
        return user_frame(st.stack)  # killed: its published state may be stale, its dump is not
    c = st.in_collective or (st.exc.collective if st.exc else None)
    if c and c.site:
        return c.site
    return user_frame(st.stack) or st.where


def doing(st: RankState) -> str:
    """Plain words for what a rank is doing now."""
    ex = st.exit or ExitStatus()
    if st.missing:
        return "never reported (did not start the probe)"
    if st.exc:
        e = st.exc
        c = e.collective
        if c:
            return (f"waited in {c.op} at {where(c.site)}, then failed with {e.type}: "
                    f"{gist(e.message)} (a consequence)")
        return f"raised {e.type} at {where(e.location)}"
    if ex.signal:
        return f"was killed by {ex.signal}"
    if st.done or ex.exit_code == 0:
        return f"finished after {st.step} steps"
    if ex.exit_code not in (None, 0):
        return f"exited with code {ex.exit_code}"
    c = st.in_collective
    if c:
        return f"waits in {c.op} (#{c.seq} on {c.group}) at {where(c.site)}{inside_library(st, c.site)}"
    blocked = f", {blocked_words(st.outside)}" if st.outside else ""
    if st.in_data_wait:
        return f"waits for a batch from its DataLoader at {where(rank_site(st))}{blocked}"
    return f"is at {where(rank_site(st))}{blocked}"


def _bytes(n: int) -> str:
    return f"{n} B" if n < 10_000 else f"{n / 1e3:.0f} kB" if n < 10_000_000 else f"{n / 1e6:.0f} MB"


def blocked_words(o: OutsideWait) -> str:
    """Plain words for the system call a rank's thread is blocked in and its peer (``evidence.OutsideWait``)."""
    call = f"{o.call}()"
    if o.kind == "socket":
        to = f"a {o.proto.upper() if o.proto else ''} connection to {o.remote}".replace("a  ", "a ") if o.remote \
            else f"a {o.proto or ''} socket".replace("a  ", "a ")
        q = []
        if o.send_queue:
            q.append(f"{_bytes(o.send_queue)} queued to send, not yet acknowledged by the peer")
        if o.recv_queue:
            q.append(f"{_bytes(o.recv_queue)} received and unread")
        if o.send_queue == 0 and o.recv_queue == 0:
            q.append("no bytes in flight either way")
        return f"blocked in {call} on {to}" + (f" ({', '.join(q)})" if q else "")
    if o.kind == "child":
        if o.path:  # reading its output through a pipe
            return f"blocked in {call} on the output of {o.peer()}"
        return f"blocked in {call} waiting for " + (o.peer() if o.pid else "a child process") + " to exit"
    if o.kind in ("fifo", "file"):
        what = "the FIFO" if o.kind == "fifo" else "the file"
        mount = f" (mount: {o.mount})" if o.mount else ""
        if o.call == "openat":
            until = " until a writer opens it" if o.kind == "fifo" else ""
            return f"blocked opening {what} {o.path}{mount}{until}"
        return f"blocked in {call} on {what} {o.path}{mount}"
    if o.kind == "pipe":
        return f"blocked in {call} on a pipe ({o.path})"
    if o.kind == "sleep":
        return f"sleeping ({call})"
    if o.kind == "lock":
        return f"blocked on a lock or a condition ({call})"
    return f"blocked in {call}"


def inside_library(st: RankState, site: Site | None) -> str:
    """Where in an installed library a rank waits when its user line is only the call into it (Lightning's
    loop under `trainer.fit`, accelerate's loader): " (inside lightning: training_epoch_loop.py:265 (...))".

    Only for a library frame that called straight into torch, in a stack that is not importing a module
    (DDP's first construction imports dynamo: that stack says nothing about the collective)."""
    stack = list(st.stack)
    user = innermost_user(stack)
    if site is None or user is None or user.key() != site.key():
        return ""
    deeper = stack[len(stack) - stack[::-1].index(user):]
    if any(f.function == "<module>" for f in deeper):
        return ""
    libs = [i for i, f in enumerate(deeper) if kind(f.path) == LIBRARY and "-packages" in f.path.replace("\\", "/")]
    if not libs or libs[-1] + 1 >= len(deeper):
        return ""
    f, nxt = deeper[libs[-1]], deeper[libs[-1] + 1]
    if "/torch/" not in nxt.path.replace("\\", "/"):
        return ""
    package = f.path.replace("\\", "/").split("-packages/", 1)[-1].split("/", 1)[0]
    return f" (inside {package}: {where(f)})"


def gist(message: str, limit: int = 160) -> str:
    """The first sentence of an error message, cut at ``limit`` characters."""
    text = " ".join((message or "").split())
    i = text.find(". ")
    text = text[: i + 1] if 0 < i < limit else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


def ranks_of(ev: JobEvidence) -> dict[int, RankState]:
    return dict(ev.ranks)


GROUP_OVER = 8   # more ranks than this doing the same: one phrase ("ranks 0-4095, 4097-9999 each waits ...")


def others_text(ranks: dict[int, RankState], exclude: set[int]) -> str:
    by: dict[str, list[int]] = {}
    for r, st in sorted(ranks.items()):
        if r not in exclude:
            by.setdefault(doing(st), []).append(r)
    if all(len(rs) <= GROUP_OVER for rs in by.values()):
        parts = [f"rank {r} {doing(st)}" for r, st in sorted(ranks.items()) if r not in exclude]
        return "; ".join(parts)
    parts = [(rs[0], f"ranks {rank_runs(rs)} each {what}" if len(rs) > GROUP_OVER else
              "; ".join(f"rank {r} {what}" for r in rs)) for what, rs in by.items()]
    return "; ".join(p for _, p in sorted(parts))


def step_evidence(ranks: dict[int, RankState]) -> dict[str, Any]:
    return {"steps": {str(r): st.step for r, st in ranks.items()},
            "steps_by_epoch": {str(r): list(st.steps_by_epoch) for r, st in ranks.items()},
            "forwards": {str(r): st.forwards for r, st in ranks.items()},
            "epoch": {str(r): st.epoch for r, st in ranks.items()}}


FIX_201 = runtime_fix("DDP201")
FIX_202 = runtime_fix("DDP202")
FIX_203 = runtime_fix("DDP203")
FIX_101 = runtime_fix("DDP101")


def lint_line(lint, code: str, near: Site | None, path_hint: str | None) -> Site | None:
    """The lint finding of ``code`` in the user's script nearest to ``near`` (the statically located cause):
    its cause line when lint named one elsewhere (a helper's early ``return``), else its own line."""
    path = (near.path if near else None) or path_hint

    def lines(m):
        return [x for x in ((m.path, m.line), (m.cause.path, m.cause.line) if m.cause else None) if x]

    cands = [m for m in lint or () if m.code == code and
             (not path or any(same_file(p, path) for p, _ in lines(m)))]
    if not cands:
        return None
    line = (near.line if near else 0) or 0
    best = min(cands, key=lambda m: min(abs(ln - line) for _p, ln in lines(m)))
    return best.cause or Site(best.path, best.line, None)


def lint_flagged(lint, code: str, site: Site) -> bool:
    """Did lint report ``code`` on this very line (same file name, same line)?"""
    return any(m.code == code and same_line(m.path, m.line, site.path, site.line) for m in lint or ())


def same_file(path_a: str | None, path_b: str | None) -> bool:
    """One source file seen from lint and from the runtime: a file of the same name (paths differ between
    nodes, launch dirs and where a dump is read), unless both files are here and are different files."""
    if os.path.basename(path_a or "") != os.path.basename(path_b or ""):
        return False
    if path_a and path_b and path_a != path_b and os.path.isfile(path_a) and os.path.isfile(path_b):
        return os.path.samefile(path_a, path_b)
    return True


def verdict_of(reason: str | None, *, failed: bool = False, blocked: bool = False, ended_early: bool = False) -> str:
    """The report's verdict for what was decided (``reason``, the words of ``evidence.Verdict.reason``: desync,
    hang, stalled, exit; None: nothing wrong) -- the one mapping for run, its guarded fallback, attach and Flight
    Recorder (docs/verdicts.md).  A desync a rank then failed on is a crash, one the ranks stay blocked in a
    hang; an exit is a crash unless ranks merely left the training loop early (``ended_early``: a desync)."""
    if reason == "desync":
        return "crash" if failed else ("hang" if blocked else "desync")
    if reason in ("hang", "stalled"):
        return reason
    if reason == "exit":
        return "desync" if ended_early else "crash"
    return "ok"


def same_line(path_a: str | None, line_a: int | None, path_b: str | None, line_b: int | None) -> bool:
    """One source line seen from lint and from the runtime (``same_file``, same line number)."""
    return line_a == line_b and same_file(path_a, path_b)




def same_hazard(lint_code: str, runtime_code: str) -> bool:
    """Does a runtime finding of ``runtime_code`` confirm lint's ``lint_code`` on the same line?"""
    return lint_code == runtime_code or {lint_code, runtime_code} <= STEP_FAMILY | {ENDED_EARLY}
