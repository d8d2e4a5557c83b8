"""What the watcher knows of one rank across polls: its latest state plus the history diagnosis needs
(collective fingerprints by position, every (op, call site) it ever ran, CPU/line samples for "busy")."""
from __future__ import annotations

import time

from ddp_doctor.evidence import Collective, ExitStatus, RankState, Site, ThreadStack, WorkerStack


class RankView:
    """What the watcher knows of one rank across polls."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state: RankState | None = None
        self.progress = -1
        self.progress_t = time.monotonic()
        self.samples: list[tuple[float, float, Site | None]] = []  # (t, cpu_s, where)
        self.fps: dict[tuple[str | None, int | None], Collective] = {}  # (group, seq) -> fingerprint
        self.sites_seen: set[tuple] = set()            # (op, site key)
        self.exit: ExitStatus | None = None
        self.stack: tuple[Site, ...] = ()
        self.threads: tuple[ThreadStack, ...] = ()
        self.workers: list[WorkerStack] = []

    def update(self, state: RankState, now: float) -> None:
        if state.timeline is None and self.state is not None and self.state.timeline is not None:
            state = state.with_(timeline=self.state.timeline)  # periodic states omit it; keep the last full one
        self.state = state
        if state.progress != self.progress:
            self.progress = state.progress
            self.progress_t = now
        self.samples.append((now, state.cpu_s, state.where))
        self.samples = [s for s in self.samples if now - s[0] <= 3.0]
        for c in state.fingerprints:
            self.fps[(c.group, c.seq)] = c
        if len(self.fps) > 4000:
            for k in sorted(self.fps, key=lambda k: k[1])[: len(self.fps) - 3000]:
                del self.fps[k]
        for sc in state.site_counts:
            self.sites_seen.add((sc.op, sc.site.key() if sc.site else None))

    def started(self) -> bool:
        """Has this rank begun distributed work (a collective, DDP, a batch)?  Imports don't count."""
        st = self.state
        return st is not None and bool(st.progress or st.seq or st.in_collective)

    def busy(self) -> bool:
        """Working outside collectives: CPU time grows, or its Python line changes."""
        st = self.state
        if st is None or st.done or self.exit:
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
        if st.in_collective:
            return False  # its line cannot change while it waits
        return any(w != w0 for _, _, w in self.samples)
