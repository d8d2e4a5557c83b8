"""What the watcher knows of one rank across polls: its latest state plus the history diagnosis needs
(collective fingerprints by position, every (op, call site) it ever ran) and when it last showed a sign
of life (progress, or its training thread's CPU, I/O or stack moving: ``active_t``)."""
from __future__ import annotations

import time
from collections import deque

from ddp_doctor.evidence import Activity, Collective, ExitStatus, RankState, Site, ThreadStack, WorkerStack

CPU_ACTIVE = 0.02    # of a core, over ACTIVE_WINDOW_S: a thread that computes (a blocked one shows ~0)
ACTIVE_WINDOW_S = 1.0
FPS_LOG = 1024       # positions a view remembers it gained (more between two summaries: they compare them all)


class RankView:
    """What the watcher knows of one rank across polls."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state: RankState | None = None
        self.progress = -1
        self.progress_t = time.monotonic()
        self.active_t = self.progress_t            # last sign of life: progress, CPU, I/O, stack
        self.cpu_t = self.progress_t               # the last sample whose CPU time had grown
        self.activity: list[tuple[float, Activity]] = []  # (t, sample) over the last few seconds
        self.samples: list[tuple[float, float, Site | None]] = []  # (t, cpu_s, where)
        self.fps: dict[tuple[str | None, int | None], Collective] = {}  # (group, seq) -> fingerprint
        # the positions ``fps`` gained, newest last: the last FPS_LOG of the ``fps_count`` ever added (a summary
        # compares only the positions reached since the previous one: ``diagnose.summary``)
        self.fps_added: deque[tuple] = deque(maxlen=FPS_LOG)
        self.fps_count = 0
        self.sites_seen: set[tuple] = set()            # (op, site key)
        self.exit: ExitStatus | None = None
        self.stack: tuple[Site, ...] = ()
        self.threads: tuple[ThreadStack, ...] = ()
        self.workers: list[WorkerStack] = []
        self.outside = None    # what its training thread is blocked in (watcher.outside; read with the stacks)
        self.queues: tuple | None = None  # its socket's queues at the last look, while it is quiet
        self.remote = False    # fed with another node's full state (``from_detail``), not watched here

    @classmethod
    def from_detail(cls, state: RankState, now: float) -> "RankView":
        """A rank of another node, from the state its node's agent sent (``NodeDetail``): what that agent
        added (stacks, exit, busy, signs of life, every site the rank ran) is kept as it came."""
        v = cls(state.rank)
        v.remote = True
        v.update(state, now)
        v.sites_seen |= set(state.sites_seen)
        v.stack, v.threads, v.workers, v.exit = tuple(state.stack), tuple(state.threads), list(state.workers), state.exit
        v.outside = state.outside
        if state.stalled_s is not None:
            v.progress_t = now - state.stalled_s
        if state.idle_s is not None:
            v.active_t = now - state.idle_s
        return v

    def update(self, state: RankState, now: float) -> None:
        if state.timeline is None and self.state is not None and self.state.timeline is not None:
            state = state.with_(timeline=self.state.timeline)  # periodic states omit it; keep the last full one
        self.state = state
        if state.progress != self.progress:
            self.progress = state.progress
            self.progress_t = now
            self.active_t = now
        self._note_activity(state.activity, now)
        self.samples.append((now, state.cpu_s, state.where))
        self.samples = [s for s in self.samples if now - s[0] <= 3.0]
        fps = self.fps
        new = []
        for c in reversed(state.fingerprints):  # newest first: the ring only grows at its end, and a
            k = (c.group, c.seq)                  # fingerprint never changes once posted
            if k in fps:
                break
            fps[k] = c
            new.append(k)
        if new:
            self.fps_added.extend(reversed(new))
            self.fps_count += len(new)
        if len(self.fps) > 4000:
            for k in sorted(self.fps, key=lambda k: k[1])[: len(self.fps) - 3000]:
                del self.fps[k]
        for sc in state.site_counts:
            if not sc.op.startswith(("p2p.", "api.")):  # counts, not collectives (probe/p2p.py)
                self.sites_seen.add((sc.op, sc.site.key() if sc.site else None))

    def _note_activity(self, a: Activity | None, now: float) -> None:
        """Move ``active_t`` when the training thread's stack changed, it read or wrote, or it (or its loader
        workers) used CPU over the last second (to the last sample whose CPU time had grown).  A rank without
        samples (an old probe) counts as active whenever its published CPU time grows."""
        if a is None:
            return
        hist = self.activity
        if hist:
            prev = hist[-1][1]
            if a.stack_sig != prev.stack_sig or a.io_bytes > prev.io_bytes:
                self.active_t = now
            if a.cpu_s > prev.cpu_s or a.workers_cpu_s > prev.workers_cpu_s:
                self.cpu_t = now
            old = next(((t, x) for t, x in reversed(hist) if now - t >= ACTIVE_WINDOW_S), None)
            if old is not None:
                dt = now - old[0]
                cpu = (a.cpu_s - old[1].cpu_s) + max(0.0, a.workers_cpu_s - old[1].workers_cpu_s)
                if cpu > CPU_ACTIVE * dt:
                    # the CPU that counts was spent by the last sample that showed any: a rank that stopped
                    # is idle from then on, not from the moment its last busy second leaves the window
                    # (that credited up to a window more of life than the rank had)
                    self.active_t = max(self.active_t, self.cpu_t)
        hist.append((now, a))
        while len(hist) > 2 and now - hist[1][0] >= 2 * ACTIVE_WINDOW_S:
            hist.pop(0)

    def note_queues(self, q: tuple | None, now: float) -> None:
        """The queues of the socket its quiet training thread is blocked on (``watcher.outside.queues``):
        bytes leaving its send queue or arriving are a sign of life (a throttled upload, a slow reply)."""
        if q is not None and self.queues is not None and q != self.queues:
            self.active_t = now
        self.queues = q

    def idle_s(self, now: float) -> float:
        """Seconds since this rank last showed a sign of life."""
        return max(0.0, now - self.active_t)

    def started(self) -> bool:
        """Has this rank begun distributed work (a collective, DDP, a batch)?  Imports don't count."""
        st = self.state
        return st is not None and bool(st.progress or st.seq or st.in_collective)

    def busy(self, now: float | None = None) -> bool:
        """Working: a sign of life in the last seconds (progress, CPU, I/O, a moving stack).

        (A rank inside a collective counts too: DDP's construction, forward and backward compute inside
        them, and a rank that truly waits in gloo burns no CPU.)"""
        st = self.state
        if st is None or st.done or self.exit:
            return False
        if self.remote:
            return st.busy
        if st.activity is not None:
            return (time.monotonic() if now is None else now) - self.active_t < 2 * ACTIVE_WINDOW_S + 0.5
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
