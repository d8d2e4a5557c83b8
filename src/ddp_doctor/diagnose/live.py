"""The live verdict: while the job runs, decide from the watcher's view of every rank whether it is lost.

The watcher collects (``watch/``); this module decides, so that every verdict of ddp-doctor is made in
``diagnose/``.  ``views`` maps rank -> the watcher's per-rank view: ``.rank``, ``.state`` (the rank's
latest published state), ``.exit``, ``.progress_t``, ``.fps`` ({(group, seq): fingerprint}),
``.sites_seen`` ({(op, site key)}), ``.started()`` and ``.busy()``.

Reasons: ``exit`` (a rank raised, was killed, or finished while others wait), ``desync`` (fingerprints
disagree at one sequence number, or per-epoch step counts differ), ``hang`` (no progress for the limit).
"""
from __future__ import annotations

import time
from typing import Any

from ddp_doctor.evidence import Collective, Verdict

FLOOR_S = 5.0            # adaptive hang limit never below this
FIRST_STEP_S = 10.0      # idle limit before the job's step time is known
BUSY_S = 300.0           # allowance while a rank is busy outside collectives (checkpoint, eval)
K_STEP = 10.0            # adaptive limit = K_STEP x p90 of recent step times
EXIT_GRACE_S = 3.0       # a rank finished; the others stall this long -> exit verdict


def _p(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else 0.0


class Judge:
    """Decides for one watched attempt; keeps the little state a decision needs between polls."""

    def __init__(self, hang_timeout: float | None) -> None:
        self.hang_timeout = hang_timeout
        self.not_started_since: float | None = None

    def hang_limit(self, views: dict[int, Any]) -> tuple[float, str]:
        """(seconds, how it was chosen): explicit, or learned from the job's own step times."""
        if self.hang_timeout:
            return self.hang_timeout, "--hang-timeout"
        times: list[float] = []
        for v in views.values():
            times += list(v.state.step_times[-50:]) if v.state else []
        if len(times) >= 3:
            return max(FLOOR_S, K_STEP * _p(times, 0.9)), f"adaptive: {K_STEP:g} x p90 step time, floor {FLOOR_S:g}s"
        return FIRST_STEP_S, "adaptive: before the step time is known"

    @staticmethod
    def _live(views: dict[int, Any]) -> list[Any]:
        return [v for v in views.values() if v.state and not v.exit and not v.state.done and not v.state.exc]

    def decide(self, views: dict[int, Any], world_size: int, first_state_t: float | None,
               now: float | None = None) -> Verdict | None:
        """The live verdict: a desync, a failed rank, a rank that finished while others stall, or a hang."""
        now = time.monotonic() if now is None else now
        # 1. desync (first: a mismatch is the root cause even when gloo then aborts both ranks)
        d = find_desync(views, world_size)
        if d:
            return d
        # 2. a rank raised / was killed / exited non-zero
        for r, v in views.items():
            if (v.state is not None and v.state.exc) or (v.exit and v.exit.failed):
                return Verdict("exit", rank=r)
        seen = [v for v in views.values() if v.state]
        if not seen:
            return None
        live = self._live(views)
        finished = [v for v in seen if (v.state.done or (v.exit and v.exit.exit_code == 0))]
        last_progress = max(v.progress_t for v in seen)
        stalled = now - last_progress
        if not all(v.started() for v in seen):
            # a rank still importing / before its first collective: the clock starts when all have started
            self.not_started_since = self.not_started_since or now
            last_progress = max(last_progress, now if now - self.not_started_since < BUSY_S else 0)
            stalled = now - last_progress
        else:
            self.not_started_since = None
        limit, how = self.hang_limit(views)
        # 3. a rank finished while the others stall
        if finished and live and stalled > max(EXIT_GRACE_S, min(limit, 3 * EXIT_GRACE_S)):
            return Verdict("exit", rank=finished[0].rank, finished=True, stalled_s=stalled, limit_s=limit,
                           limit_how=how)
        # 4. hang
        if not live:
            return None
        if len(seen) < world_size and now - (first_state_t or now) < limit:
            return None
        busy = [v.rank for v in live if v.busy()]
        eff = limit if (self.hang_timeout or not busy) else max(limit, BUSY_S)
        if busy and not any(v.state.step for v in seen):
            # start-up (imports, DDP construction importing dynamo, first compile): even an explicit
            # --hang-timeout does not count while a rank visibly works before the first step
            eff = max(eff, BUSY_S)
        cur = {(c.group, c.seq, c.op) if c else None for c in (v.state.in_collective for v in live)}
        if not self.hang_timeout and len(live) == world_size and len(cur) == 1 and live[0].state.in_collective:
            # every rank is inside the very same collective: the program agrees; the transport is slow
            eff, how = max(eff, BUSY_S), "every rank inside the same collective: waiting for the transport"
        if busy and eff > limit and "transport" not in how:
            how = f"busy ranks {busy} (CPU or Python line moving): extended to {eff:g}s"
        if stalled > eff:
            return Verdict("hang", stalled_s=round(stalled, 2), limit_s=round(eff, 2), limit_how=how,
                           busy=tuple(busy))
        return None


def find_desync(views: dict[int, Any], world_size: int) -> Verdict | None:
    """First (group, seq) where two ranks' fingerprints disagree; or per-epoch step counts that differ."""
    seen = [v for v in views.values() if v.state]
    if len(seen) < 2:
        return None
    keys: dict[tuple, list[int]] = {}
    for v in seen:
        for k in v.fps:
            keys.setdefault(k, []).append(v.rank)
    for k in sorted(keys, key=lambda k: (k[1], k[0])):
        ranks = keys[k]
        if len(ranks) < 2:
            continue
        fps = {r: views[r].fps[k] for r in ranks}
        kind = _compare(fps, views)
        if kind:
            return Verdict("desync", kind=kind, group=k[0], seq=k[1], calls=fps)
    # per-epoch step counts of the train loader, for epochs every rank has finished
    counts = {v.rank: v.state.steps_by_epoch for v in seen}
    if len(counts) == world_size:
        done_epochs = min(len(c) for c in counts.values()) - 1
        for e in range(max(0, done_epochs)):
            vals = {r: c[e] for r, c in counts.items()}
            if len(set(vals.values())) > 1:
                return Verdict("desync", kind="steps", epoch=e, steps=vals)
    return None


def any_failed(views: dict[int, Any]) -> bool:
    """Has a rank raised, been killed or exited non-zero?  Fixed at the moment of a decision: failures
    after it are consequences of the stop, not the verdict."""
    return any((v.state is not None and v.state.exc is not None) or (v.exit is not None and v.exit.failed)
               for v in views.values())


def blocked_at(decision: Verdict, views: dict[int, Any]) -> bool:
    """Every rank of a fingerprint desync still waits at the mismatching position (the job hangs there);
    False when they moved on (gloo paired the mismatched calls silently)."""
    return all(views[r].state is not None and views[r].state.in_collective is not None
               and views[r].state.in_collective.seq == decision.seq for r in decision.calls)


def _compare(fps: dict[int, Collective], views: dict[int, Any]) -> str | None:
    """None when the calls agree; else 'op'|'shape'|'site'|'steps' (what disagrees)."""
    vals = list(fps.values())
    if len({c.op for c in vals}) > 1:
        return "op"
    if len({(c.shapes, c.dtypes) for c in vals}) > 1:
        return "shape"
    keys = {r: c.site.key() if c.site else None for r, c in fps.items()}
    op = vals[0].op
    if len(set(keys.values())) > 1:
        if op.startswith("ddp."):
            # a DDP call at a line some other rank never ran it at: DDP on a subset of ranks
            for r in fps:
                if any((op, keys[r]) not in views[o].sites_seen for o in fps if o != r):
                    return "site"
        return None  # same collective from two branches (e.g. src/dst branches): fine
    eps = {(c.epoch, c.step_in_epoch) for c in vals if c.epoch is not None}
    if len(eps) > 1 and all(c.epoch is not None for c in vals):
        return "steps"
    return None
