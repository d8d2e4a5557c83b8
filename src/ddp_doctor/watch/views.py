"""What the watcher knows of one rank across polls: its latest state plus the history diagnosis needs
(collective fingerprints by position, every (op, call site) it ever ran, CPU/line samples for "busy")."""
from __future__ import annotations

import json
import os
import time
from typing import Any


def site_key(site) -> tuple | None:
    """Sites compare by file name, line and function (paths differ between nodes)."""
    if not site:
        return None
    if isinstance(site, dict):
        return (os.path.basename(site["path"]), site["line"], site.get("function"))
    return (os.path.basename(site[0]), site[1], site[2])


class RankView:
    """What the watcher knows of one rank across polls."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state: dict[str, Any] | None = None
        self.progress = -1
        self.progress_t = time.monotonic()
        self.samples: list[tuple[float, float, Any]] = []  # (t, cpu_s, where)
        self.fps: dict[tuple[str, int], tuple] = {}  # (group, seq) -> (op, shapes, dtypes, site_key, epoch, step, site)
        self.sites_seen: set[tuple] = set()            # (op, site_key)
        self.exit: dict[str, Any] | None = None          # {"exit_code", "signal"} once gone
        self.stack: list[dict] = []
        self.threads: list[dict] = []
        self.workers: list[dict] = []

    def update(self, state: dict[str, Any], now: float) -> None:
        if "timeline" not in state and self.state and "timeline" in self.state:
            state["timeline"] = self.state["timeline"]  # periodic states omit it; keep the last full one
        self.state = state
        if state.get("progress", 0) != self.progress:
            self.progress = state.get("progress", 0)
            self.progress_t = now
        self.samples.append((now, state.get("cpu_s", 0.0), json.dumps(state.get("where"))))
        self.samples = [s for s in self.samples if now - s[0] <= 3.0]
        sites = state.get("sites") or []

        def sk(i):
            return site_key(sites[i]) if i is not None and i < len(sites) else None

        for g, seq, op, shapes, dtypes, si, ep, st in state.get("fingerprints") or []:
            s = sites[si] if si is not None and si < len(sites) else None
            self.fps[(g, seq)] = (op, tuple(shapes), tuple(dtypes), sk(si), ep, st,
                                  None if s is None else {"path": s[0], "line": s[1], "function": s[2]})
        if len(self.fps) > 4000:
            for k in sorted(self.fps, key=lambda k: k[1])[: len(self.fps) - 3000]:
                del self.fps[k]
        for op, si, _n in state.get("site_counts") or []:
            self.sites_seen.add((op, sk(si)))

    def started(self) -> bool:
        """Has this rank begun distributed work (a collective, DDP, a batch)?  Imports don't count."""
        st = self.state or {}
        return bool(st.get("progress") or st.get("seq") or st.get("in_collective"))

    def busy(self) -> bool:
        """Working outside collectives: CPU time grows, or its Python line changes."""
        st = self.state or {}
        if st.get("done") or self.exit:
            return False
        # (a rank inside a collective counts too: DDP's construction, forward and backward compute
        # inside them, and a rank that truly waits in gloo burns no CPU)
        if len(self.samples) < 2:
            return False
        (t0, c0, w0), (t1, c1, _) = self.samples[0], self.samples[-1]
        if t1 - t0 < 0.5:
            return False
        if (c1 - c0) / (t1 - t0) > 0.05:
            return True
        if st.get("in_collective"):
            return False  # its line cannot change while it waits
        return any(w != w0 for _, _, w in self.samples)

