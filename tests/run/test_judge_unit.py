"""The live verdict policy (diagnose/live.py): stop on proof; diagnose a stall (no sign of life for the limit)
and watch on, or stop there with --stop-on-stall; warn otherwise.  Views are the watcher's real RankView fed with typed states on a controlled clock."""
from __future__ import annotations

from ddp_doctor.diagnose.jobview import JobView
from ddp_doctor.diagnose.live import NO_PROGRESS_S, TRANSPORT_S, Judge, group_ranks, stops
from ddp_doctor.diagnose.summary import Summarizer
from ddp_doctor.evidence import Activity, Collective, ExitStatus, RankState, Site
from ddp_doctor.watcher.views import RankView

TRAIN = Site("/u/train.py", 40, "main")
EVAL = Site("/u/train.py", 27, "remote_eval")


def barrier(seq: int, waiting: float) -> Collective:
    return Collective("world", seq, "barrier", site=Site("/u/train.py", 53, "main"), waiting_s=waiting)


class Job:
    """Two or more ranks fed on a fake clock: each tick publishes a state per rank."""

    def __init__(self, n: int = 2, hang_timeout: float | None = None, stop_on_stall: bool = False) -> None:
        self.views = {r: RankView(r) for r in range(n)}
        self.judge = Judge(hang_timeout, stop_on_stall)
        self.t = 100.0
        self.cpu = {r: 0.0 for r in range(n)}
        self.sig = {r: 1 for r in range(n)}

    def tick(self, dt: float, states: dict[int, dict], *, busy: tuple[int, ...] = (), moving: tuple[int, ...] = ()):
        """Advance the clock by ``dt`` in 0.25 s publishes; ``busy`` ranks burn CPU, ``moving`` ranks change line."""
        end = self.t + dt
        verdict = None
        while self.t < end and verdict is None:
            self.t += 0.25
            for r, kw in states.items():
                if r in busy:
                    self.cpu[r] += 0.25
                if r in moving:
                    self.sig[r] += 1
                kw = dict(kw)
                c = kw.get("in_collective")
                if c is not None:
                    kw["in_collective"] = Collective(c.group, c.seq, c.op, site=c.site,
                                                     waiting_s=(c.waiting_s or 0) + self.t - self.t0)
                st = RankState(rank=r, world_size=len(self.views), progress=kw.pop("progress", 50),
                               activity=Activity(self.cpu[r], 0, 0.0, self.sig[r]), **kw)
                self.views[r].update(st, self.t)
            node = Summarizer().summary(self.views, self.t, first_state_t=1.0)  # a single node, as the watcher
            verdict = self.judge.decide_job(JobView(len(self.views), [(node, 0.0)]), self.t)
        return verdict

    def start(self) -> "Job":
        self.t0 = self.t
        return self


def test_a_rank_idle_for_25s_while_another_waits_is_a_warning_not_a_stop():
    job = Job().start()
    states = {0: {"in_collective": barrier(12, 0), "seq": {"world": 13}}, 1: {"where": EVAL, "seq": {"world": 12}}}
    assert job.tick(25, states) is None
    s = job.judge.suspicion
    assert s is not None and set(s.waiting) == {0} and s.outside == {1: EVAL} and s.idle_s[1] >= 20
    assert job.judge.longest is s


def test_no_sign_of_life_for_the_default_limit_is_a_stall_diagnosed_once_never_a_stop():
    job = Job().start()
    states = {0: {"in_collective": barrier(12, 0)}, 1: {"where": EVAL}}
    v = job.tick(NO_PROGRESS_S + 5, states)
    assert v is not None and v.reason == "stalled" and NO_PROGRESS_S < v.stalled_s <= NO_PROGRESS_S + 1
    assert not stops(v)
    assert job.tick(300, states) is None  # diagnosed once; the job runs on (the process group's timeout: 30 min)


def test_a_stall_resumes_when_a_rank_moves_again():
    job = Job(hang_timeout=10).start()
    states = {0: {"in_collective": barrier(12, 0)}, 1: {"where": EVAL}}
    assert job.tick(30, states).reason == "stalled"
    v = job.tick(5, {0: states[0], 1: {"where": EVAL, "progress": 51}})
    assert v is not None and v.reason == "resumed" and not stops(v) and 10 < v.stalled_s <= 31
    assert job.tick(10.5, {0: {"in_collective": barrier(12, 0)}, 1: {"where": EVAL, "progress": 51}}).reason \
        == "stalled"  # a second stall is diagnosed again


def test_stop_on_stall_makes_the_limit_a_stop():
    job = Job(hang_timeout=10, stop_on_stall=True).start()
    v = job.tick(30, {0: {"in_collective": barrier(12, 0)}, 1: {"where": EVAL}})
    assert v is not None and v.reason == "hang" and stops(v) and 10 < v.stalled_s <= 10.5
    assert "--stop-on-stall" in v.limit_how


def test_a_busy_rank_is_never_stuck_even_with_hang_timeout():
    job = Job(hang_timeout=10, stop_on_stall=True).start()
    states = {0: {"in_collective": barrier(12, 0)}, 1: {"where": EVAL}}
    assert job.tick(200, states, busy=(1,)) is None
    assert job.tick(200, states, moving=(1,)) is None  # a Python line that moves is a sign of life too
    assert job.tick(10.5, states).reason == "hang"      # then nothing moves


def test_a_draining_send_queue_is_a_sign_of_life():
    """A rank blocked in one long sendall: CPU, I/O counters and stack stay flat; its socket's send queue
    moving (the watcher reads it: watcher.outside.queues) keeps it alive, a queue that stays put does not."""
    job = Job(hang_timeout=10).start()
    states = {0: {"in_collective": barrier(12, 0)}, 1: {"where": EVAL}}
    queued = 4_000_000
    for _ in range(60):  # 30 s
        assert job.tick(0.5, states) is None
        queued -= 20_000
        job.views[1].note_queues((5, queued, 0), job.t)
    for _ in range(30):
        job.views[1].note_queues((5, queued, 0), job.t)
        v = job.tick(0.5, states)
        if v is not None:
            break
    assert v is not None and v.reason == "stalled"


def test_the_process_group_timeout_would_fire_anyway():
    job = Job().start()
    states = {0: {"in_collective": barrier(12, 0), "pg_timeout_s": 60.0}, 1: {"where": EVAL, "pg_timeout_s": 60.0}}
    v = job.tick(200, states, busy=(1,))
    assert v is not None and v.kind == "pg-timeout" and 56 <= job.t - job.t0 <= 58


def test_a_rank_that_finished_after_its_last_collective_is_fine():
    job = Job().start()
    done = {"done": True, "seq": {"world": 20}}
    assert job.tick(30, {0: done, 1: {"where": EVAL, "seq": {"world": 20}}}, busy=(1,)) is None


def test_a_finished_rank_needed_by_a_collective_is_proof():
    job = Job().start()
    done = {"done": True, "seq": {"world": 20}}
    v = job.tick(5, {0: done, 1: {"in_collective": barrier(20, 0), "seq": {"world": 21}}})
    assert v is not None and v.reason == "exit" and v.finished and v.rank == 0 and job.t - job.t0 < 1.5


def test_a_finished_rank_is_not_needed_by_a_group_it_is_not_in():
    job = Job(4).start()
    sub = Collective("pg:2,3", 5, "all_reduce", site=TRAIN)
    states = {0: {"done": True, "seq": {"world": 9}}, 1: {"done": True, "seq": {"world": 9}},
              2: {"in_collective": sub, "seq": {"world": 9}}, 3: {"where": TRAIN, "seq": {"world": 9}}}
    assert job.tick(20, states, busy=(3,)) is None


def test_every_rank_in_the_same_collective_waits_for_the_transport():
    job = Job().start()
    states = {0: {"in_collective": barrier(12, 0)}, 1: {"in_collective": barrier(12, 0)}}
    assert job.tick(NO_PROGRESS_S + 30, states) is None
    assert job.tick(TRANSPORT_S, states).reason == "stalled"


def test_a_failed_rank_is_proof_at_once():
    job = Job().start()
    job.views[1].exit = ExitStatus(1, None)
    v = job.tick(0.5, {0: {"in_collective": barrier(3, 0)}, 1: {"where": TRAIN}})
    assert v.reason == "exit" and v.rank == 1


def test_group_ranks():
    assert group_ranks("world", 3) == {0, 1, 2}
    assert group_ranks("pg:1,3", 4) == {1, 3}
    assert group_ranks("pg?", 4) is None


def test_a_calm_job_is_looked_at_less_often_and_a_stalling_one_at_once():
    """The watcher's full look (states, summary, verdict) costs the ranks' CPU: once a second while every
    rank progresses, every poll as soon as anything the policy acts on is under way."""
    from ddp_doctor.diagnose.summary import Summarizer, calm
    from ddp_doctor.watcher import CALM_POLL, POLL, Watcher

    job = Job(n=2).start()
    w = Watcher(None, world_size=2, hang_timeout=None, run_dir="/nonexistent")
    w.views = job.views

    def look(states) -> float:
        job.tick(1.0, states)
        w.node_summary = Summarizer().summary(job.views, job.t, first_state_t=job.t0)
        w.judge = job.judge
        return w.interval()

    for step in range(1, 4):  # every rank progresses: one full look a second
        assert look({r: {"progress": 10 * step} for r in (0, 1)}) == CALM_POLL
    assert calm(w.node_summary, 2)
    # rank 0 waits at a barrier while rank 1 no longer progresses: every poll
    assert look({0: {"in_collective": barrier(12, 0), "progress": 500}, 1: {"where": EVAL, "progress": 500}}) == POLL
    # a rank that has not posted yet: every poll
    w.node_summary = Summarizer().summary({0: job.views[0]}, job.t)
    assert not calm(w.node_summary, 2) and w.interval() == POLL


def test_a_post_made_at_once_brings_the_next_look_forward():
    """A probe posts at once before a collective at a new line (where mismatches are born) and bumps NEWS:
    a calm watcher looks at the next poll instead of up to a second later."""
    from ddp_doctor import store as side
    from ddp_doctor.watcher import Watcher

    class Counters:
        def __init__(self):
            self.n = {}

        def add(self, key, k):
            self.n[key] = self.n.get(key, 0) + k
            return self.n[key]

    store = Counters()
    w = Watcher(store, world_size=2, hang_timeout=None, run_dir="/nonexistent")
    assert not w._news()
    store.add(side.NEWS, 1)
    assert w._news() and not w._news()


def test_a_rank_that_stops_computing_is_idle_from_its_last_busy_sample_not_a_window_later():
    """The CPU over the last second is a sign of life, credited to the last sample that showed CPU spent:
    a rank that stopped is idle from then on (it was idle a window later, stalls were seen ~1 s late)."""
    v = RankView(0)
    cpu = 0.0
    for k in range(1, 13):
        cpu += 0.2 if k <= 8 else 0.0       # computes until t = 2.0, then blocks
        v.update(RankState(rank=0, progress=1, activity=Activity(cpu, 0, 0.0, 1)), k * 0.25)
    assert v.active_t == 2.0 and v.idle_s(3.0) == 1.0
    busy = RankView(1)   # a rank that computes on stays active at every sample
    for k in range(1, 13):
        busy.update(RankState(rank=1, progress=1, activity=Activity(k * 0.05, 0, 0.0, 1)), k * 0.25)
        assert k < 5 or busy.active_t == k * 0.25


def test_a_summary_compares_only_the_positions_reached_since_the_last_yet_proves_what_comparing_all_does():
    """``Summarizer`` cuts each view to the positions some rank reached since its previous summary; on ranks
    that move at different speeds (one lags hundreds of positions behind, then catches up) with a mismatch
    at a random position, its desync is the one ``find_desync`` finds comparing every position, at every poll."""
    import random

    from ddp_doctor.diagnose.live import find_desync
    from ddp_doctor.diagnose.summary import Summarizer

    rng = random.Random(7)
    for trial in range(5):
        odd_rank, odd_at = rng.randrange(3), rng.randrange(20, 350)
        views = {r: RankView(r) for r in range(3)}
        pos = {r: 0 for r in range(3)}
        summ = Summarizer()
        t = 0.0
        while min(pos.values()) < 400:
            t += 0.2
            for r in range(3):
                pos[r] = min(400, pos[r] + (rng.randrange(0, 8) if r != 2 or t > 10 else rng.randrange(0, 2)))
                ring = tuple(Collective("world", s, "all_reduce", ("8",) if (r, s) == (odd_rank, odd_at) else ("4",),
                                        ("float32",), TRAIN) for s in range(max(0, pos[r] - 32), pos[r]))
                views[r].update(RankState(rank=r, progress=pos[r], seq={"world": pos[r]}, fingerprints=ring), t)
            got = summ.summary(views, t).desync
            want = find_desync(views, 3)
            assert (got is None) == (want is None), (trial, t, pos)
            if want is not None:
                assert (got.seq, got.kind, got.group) == (want.seq, want.kind, want.group)
                assert (got.seq, got.group) == (odd_at, "world")
                break
        assert want is not None or odd_at >= max(pos.values())


def test_a_node_notes_no_rank_exit_once_the_root_ordered_the_stop():
    """A node of several: after the root's stop order, its ranks end by that stop; noted as exits they reached
    the root's final states as ranks gone while the others wait (DDP204 instead of the stall's DDP205, seen in
    CI under load).  A rank that ends before the order is noted as before."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from types import SimpleNamespace

    from ddp_doctor.watcher import Watcher
    from ddp_doctor.watcher.views import RankView

    class Uplink:
        def pull_for_me(self, ctl):
            return None

    children = []  # (kept: a Popen collected reaps its child)

    def dead_child() -> int:
        p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        children.append(p)
        p.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # poll, never reap: the watcher peeks with WNOWAIT
            if os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
                return p.pid
            time.sleep(0.01)
        raise AssertionError("the child did not end")

    stopped: list[bool] = []
    w = Watcher(None, world_size=2, hang_timeout=None, run_dir="/nonexistent", uplink=Uplink(),
                on_stop=lambda: stopped.append(True), local_world=2)
    w.views = {0: RankView(0), 1: RankView(1)}
    w.local_pids = {dead_child(): 0}
    w.check_local_exits()
    assert w.views[0].exit is not None and w.views[0].exit.signal == "SIGTERM"  # before the order: a fact
    w._obey(SimpleNamespace(stop=True))
    assert stopped == [True]
    w.local_pids[dead_child()] = 1
    w.check_local_exits()
    assert w.views[1].exit is None  # after it: the stop's doing
    for p in children:
        p.wait()


def test_a_summary_after_a_join_era_jump_costs_what_the_view_holds():
    """After DDP's Join the probe numbers a group's calls from a new era (``probe.groups.ERA``: 10^9 per Join
    exit).  A summary's window spanned every number between the lowest and the highest position gained -- a
    billion lookups per view: the watcher spun there until the job ended (join_uneven's launcher burnt 7 CPU-s
    and decided nothing after its Join).  The window now costs what each view holds (its lookups counted, not
    timed), and finds the same."""
    from ddp_doctor.diagnose.live import find_desync
    from ddp_doctor.diagnose.summary import Summarizer
    from ddp_doctor.probe.groups import ERA

    views = {r: RankView(r) for r in range(2)}
    summ = Summarizer()
    for r in range(2):
        ring = tuple(Collective("world", s, "all_reduce", ("4",), ("float32",), TRAIN) for s in range(0, 30))
        views[r].update(RankState(rank=r, progress=30, seq={"world": 30}, fingerprints=ring), 1.0)
    assert summ.summary(views, 1.0).desync is None
    for r in range(2):  # rank 1 gains its last pre-Join call late, both then run calls of the new era
        late = (Collective("world", 30, "all_reduce", ("8",) if r else ("4",), ("float32",), TRAIN),) if r else ()
        ring = late + tuple(Collective("world", ERA + s, "all_reduce", ("4",), ("float32",), TRAIN) for s in range(31))
        if not r:
            ring = (Collective("world", 30, "all_reduce", ("4",), ("float32",), TRAIN),) + ring
        views[r].update(RankState(rank=r, progress=90, seq={"world": ERA + 31}, fingerprints=ring), 2.0)
    class Lookups(dict):  # counts what the window asks of a view (the code before asked ~10^9 times)
        asked = 0

        def get(self, key, default=None):
            Lookups.asked += 1
            assert Lookups.asked <= 10 * 64, "the window asks for positions no view holds"
            return super().get(key, default)

    for v in views.values():
        v.fps = Lookups(v.fps)
    got = summ.summary(views, 2.0).desync
    for v in views.values():
        v.fps = dict(v.fps)
    want = find_desync(views, 2)
    assert want is not None and got is not None and (got.seq, got.group) == (want.seq, want.group) == (30, "world")
