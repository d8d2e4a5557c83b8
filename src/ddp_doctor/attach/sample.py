"""Take a few stack samples of every rank (and DataLoader worker) of a job, without stopping anything."""
from __future__ import annotations

import time
from dataclasses import dataclass, field

from ddp_doctor.attach.classify import StackActivity, classify
from ddp_doctor.attach.discover import DiscoveredJob, RankProcess
from ddp_doctor.attach.pyspy import dump, main_thread, stack_key
from ddp_doctor.evidence import ThreadStack


BUSY_CPU_SHARE = 0.05  # of one core, over the sampling window
BUSY_IO_BYTES = 4096


@dataclass
class SampledWorker:
    """A DataLoader worker (or other child) of a rank: its main thread's latest stack."""

    pid: int
    stack: ThreadStack | None
    unchanged_s: float


@dataclass
class SampledRank:
    """One rank as seen over the sampling window."""

    proc: RankProcess
    activity: StackActivity
    stack: ThreadStack | None  # main thread, latest sample
    threads: list[ThreadStack]
    unchanged_s: float  # the main thread's position (activity and user line) has not changed for at least this
    window_s: float  # how long the sampling window was
    cpu_s: float | None  # CPU seconds the process (all threads) used during the window
    moved: bool  # the position changed between samples
    gone: bool = False
    workers: list[SampledWorker] = field(default_factory=list)
    io_bytes: int | None = None  # bytes read + written by the process during the window (/proc/PID/io)

    @property
    def busy(self) -> bool:
        """Making progress where the stack cannot show it: a training loop spends most of its time in the same
        backward() line, but uses CPU and moves bytes (gloo's socket writes); a rank blocked in a collective or on
        a lock does neither (measured here: < 1% CPU and 0 bytes hung, > 10% and > 100 kB/s training)."""
        if self.window_s <= 0:
            return False
        return (self.cpu_s is not None and self.cpu_s / self.window_s > BUSY_CPU_SHARE) or \
            (self.io_bytes is not None and self.io_bytes > BUSY_IO_BYTES)

    @property
    def stuck(self) -> bool:
        return not self.gone and not self.moved and not self.busy


def _cpu(pid: int) -> float | None:
    import psutil

    try:
        t = psutil.Process(pid).cpu_times()
        return t.user + t.system
    except psutil.Error:
        return None


def _io(pid: int) -> int | None:
    import psutil

    try:
        c = psutil.Process(pid).io_counters()
        return c.read_chars + c.write_chars
    except (psutil.Error, AttributeError, NotImplementedError):
        return None


def _alive(pid: int) -> bool:
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _unchanged(history: list[tuple[float, tuple]]) -> tuple[float, bool]:
    """(seconds the latest key has held, whether the key ever changed) from [(t, key)]."""
    if not history:
        return 0.0, False
    t_last, k_last = history[-1]
    since = t_last
    moved = False
    for t, k in reversed(history):
        if k != k_last:
            moved = True
            break
        since = t
    return t_last - since, moved


def sample_job(job: DiscoveredJob, samples: int = 3, interval_s: float = 1.0) -> list[SampledRank]:
    """``samples`` stack dumps of every rank ``interval_s`` apart; ranks that vanish are marked gone."""
    samples = max(1, samples)
    cpu0 = {r.pid: _cpu(r.pid) for r in job.ranks}
    io0 = {r.pid: _io(r.pid) for r in job.ranks}
    t0 = time.monotonic()
    hist: dict[int, list[tuple[float, tuple]]] = {r.pid: [] for r in job.ranks}
    whist: dict[int, list[tuple[float, tuple]]] = {w: [] for r in job.ranks for w in r.workers}
    last: dict[int, list[ThreadStack]] = {}
    gone: set[int] = set()
    for i in range(samples):
        if i:
            time.sleep(interval_s)
        for r in job.ranks:
            if r.pid in gone:
                continue
            if not _alive(r.pid):
                gone.add(r.pid)
                continue
            try:
                threads = dump(r.pid)
            except ProcessLookupError:
                gone.add(r.pid)
                continue
            now = time.monotonic()
            last[r.pid] = threads
            mt = main_thread(threads)
            hist[r.pid].append((now, classify(mt.frames if mt else []).key()))
            for w in r.workers:
                if not _alive(w):
                    continue
                try:
                    wt = dump(w)
                except (ProcessLookupError, Exception):  # a worker that exits between listing and dump
                    continue
                last[w] = wt
                wm = main_thread(wt)
                whist[w].append((time.monotonic(), stack_key(wm)))
    window = time.monotonic() - t0
    views = []
    for r in job.ranks:
        threads = last.get(r.pid, [])
        mt = main_thread(threads)
        unchanged, moved = _unchanged(hist[r.pid])
        c1 = _cpu(r.pid)
        cpu = (c1 - cpu0[r.pid]) if c1 is not None and cpu0[r.pid] is not None else None
        i1 = _io(r.pid)
        io = (i1 - io0[r.pid]) if i1 is not None and io0[r.pid] is not None else None
        workers = []
        for w in r.workers:
            if w in last:
                wm = main_thread(last[w])
                workers.append(SampledWorker(w, wm, _unchanged(whist[w])[0]))
        views.append(SampledRank(r, classify(mt.frames if mt else []), mt, threads, unchanged, window, cpu, moved,
                              gone=r.pid in gone or not threads, workers=workers, io_bytes=io))
    return views
