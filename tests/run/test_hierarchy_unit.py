"""Hierarchical watching without processes: the verdict from node summaries is the verdict from every rank's
view; fingerprint codes tell nodes' collectives apart; a late node is never a stall; a silent one is lost.
Views are the watcher's real RankView, summaries the real Summarizer, the store a real in-process TCPStore."""
from __future__ import annotations

import json
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from ddp_doctor.channel import SideChannel
from ddp_doctor.diagnose.jobview import LATE_S, LOST_S, CrossCheck, JobView, codes_differ, fp_code
from ddp_doctor.diagnose.live import NO_PROGRESS_S, TRANSPORT_S, Judge, find_desync
from ddp_doctor.diagnose.summary import Summarizer
from ddp_doctor.evidence import Activity, Collective, ExitStatus, RankState, Site
from ddp_doctor.watcher.root import Root
from ddp_doctor.watcher.uplink import Uplink
from ddp_doctor.watcher.views import RankView

TRAIN = Site("/u/train.py", 40, "main")
EVAL = Site("/u/train.py", 27, "remote_eval")
BAR = Site("/u/train.py", 53, "main")
ROOT = Path(__file__).resolve().parents[2]


def barrier(seq: int) -> Collective:
    return Collective("world", seq, "barrier", site=BAR, waiting_s=0.0)


class Job:
    """Ranks on a fake clock, seen two ways: one judge over every view, one over per-node summaries."""

    def __init__(self, n: int = 4, per_node: int = 2, hang_timeout: float | None = None) -> None:
        self.views = {r: RankView(r) for r in range(n)}
        self.nodes = [list(range(k, min(n, k + per_node))) for k in range(0, n, per_node)]
        self.summarizers = [Summarizer(node=i, digests=True) for i in range(len(self.nodes))]
        self.flat, self.split, self.tree = Judge(hang_timeout), Judge(hang_timeout), Judge(hang_timeout)
        self.t = self.t0 = 100.0
        self.cpu = {r: 0.0 for r in range(n)}

    def tick(self, dt: float, states: dict[int, dict], *, busy: tuple[int, ...] = ()):
        end = self.t + dt
        while self.t < end:
            self.t += 0.25
            for r, kw in states.items():
                if r in busy:
                    self.cpu[r] += 0.25
                kw = dict(kw)
                c = kw.get("in_collective")
                if c is not None:
                    kw["in_collective"] = Collective(c.group, c.seq, c.op, site=c.site, waiting_s=self.t - self.t0)
                st = RankState(rank=r, world_size=len(self.views), progress=kw.pop("progress", 50),
                               activity=Activity(self.cpu[r], 0, 0.0, 1), **kw)
                self.views[r].update(st, self.t)
            node = Summarizer().summary(self.views, self.t, first_state_t=1.0)  # one node deciding alone
            flat = self.flat.decide_job(JobView(len(self.views), [(node, 0.0)]), self.t)
            sums = [s.summary({r: self.views[r] for r in rs}, self.t, first_state_t=1.0)
                    for s, rs in zip(self.summarizers, self.nodes)]
            group = JobView(len(self.views), [(s, 0.0) for s in sums])
            split = self.split.decide_job(group, self.t)
            assert (flat and flat.reason, flat and flat.rank) == (split and split.reason, split and split.rank), \
                (self.t - self.t0, flat, split)
            # a tree: the nodes' summaries merged by their group leader, the root judging that one summary
            up = JobView(len(self.views), [(group.summary(0, 1, self.t), 0.0)])
            tree = self.tree.decide_job(up, self.t)
            assert (flat and flat.reason, flat and flat.rank) == (tree and tree.reason, tree and tree.rank), \
                (self.t - self.t0, flat, tree)
            if flat is not None:
                return flat
        return None


def test_a_stuck_rank_on_another_node_the_same_verdict_at_the_same_time():
    job = Job()
    states = {0: {"in_collective": barrier(12)}, 1: {"in_collective": barrier(12)},
              2: {"in_collective": barrier(12)}, 3: {"where": EVAL}}
    assert job.tick(30, states) is None
    s = job.split.suspicion
    assert s is not None and set(s.waiting) == {0, 1, 2} and s.outside == {3: EVAL}
    v = job.tick(NO_PROGRESS_S, states)
    assert v is not None and v.reason == "stalled" and NO_PROGRESS_S < v.stalled_s <= NO_PROGRESS_S + 1


def test_a_busy_rank_on_another_node_is_never_stuck():
    job = Job(hang_timeout=10)
    states = {0: {"in_collective": barrier(12)}, 1: {"in_collective": barrier(12)},
              2: {"in_collective": barrier(12)}, 3: {"where": EVAL}}
    assert job.tick(60, states, busy=(3,)) is None
    assert job.tick(11.5, states).reason == "stalled"  # (its CPU over the last second still counts)


def test_a_finished_rank_on_another_node_needed_by_a_collective_is_proof():
    job = Job()
    done = {"done": True, "seq": {"world": 20}}
    v = job.tick(5, {0: {"in_collective": barrier(20), "seq": {"world": 21}}, 1: {"where": TRAIN, "seq": {"world": 20}},
                     2: done, 3: done}, busy=(1,))
    assert v is not None and v.reason == "exit" and v.finished and v.rank == 2


def test_a_failed_rank_and_the_transport_limit_across_nodes():
    job = Job()
    job.views[3].exit = ExitStatus(1, None)
    v = job.tick(0.5, {r: {"in_collective": barrier(3)} for r in range(4)})
    assert v.reason == "exit" and v.rank == 3
    job = Job()
    same = {r: {"in_collective": barrier(12)} for r in range(4)}
    assert job.tick(NO_PROGRESS_S + 30, same) is None
    assert job.tick(TRANSPORT_S, same).reason == "stalled"


def _node_views(calls: dict[int, Collective], sites_seen: dict[int, set] | None = None) -> dict[int, RankView]:
    views = {}
    for r, c in calls.items():
        v = RankView(r)
        v.update(RankState(rank=r, world_size=len(calls), seq={c.group: c.seq + 1}, fingerprints=(c,)), 1.0)
        v.sites_seen |= (sites_seen or {}).get(r, set())
        views[r] = v
    return views


def _cross(calls: dict[int, Collective], sites_seen=None):
    """Ranks 0-1 on node 0, 2-3 on node 1: what the root's check suspects, what find_desync proves."""
    views = _node_views(calls, sites_seen)
    check = CrossCheck()
    found = []
    for node, rs in enumerate(((0, 1), (2, 3))):
        s = Summarizer(node=node, digests=True).summary({r: views[r] for r in rs}, 2.0)
        assert s.desync is None   # nothing to prove inside one node
        found += check.feed(s)
    return found, find_desync(views, len(views))


def test_codes_tell_the_nodes_collectives_apart_and_find_desync_proves_it():
    ar = Collective("world", 7, "all_reduce", ("4",), ("float32",), TRAIN, epoch=0, step_in_epoch=3)
    ag = Collective("world", 7, "all_gather", ("4",), ("float32",), TRAIN, epoch=0, step_in_epoch=3)
    found, proof = _cross({0: ar, 1: ar, 2: ag, 3: ag})
    assert [(f[0], f[2]) for f in found] == [("fingerprint", frozenset({0, 1}))]
    assert proof is not None and proof.kind == "op" and proof.seq == 7
    # the same call from another training step: inferred labels never prove a desync, nor make a suspicion
    later = Collective("world", 7, "all_reduce", ("4",), ("float32",), TRAIN, epoch=0, step_in_epoch=4)
    found, proof = _cross({0: ar, 1: ar, 2: later, 3: later})
    assert found == [] and proof is None
    wide = Collective("world", 7, "all_reduce", ("8",), ("float32",), TRAIN)
    found, proof = _cross({0: ar, 1: ar, 2: wide, 3: wide})
    assert found and proof is not None and proof.kind == "shape"


def test_a_group_leader_merges_codes_and_the_root_suspects_across_groups():
    """Two groups of one node each: each leader's summary carries its node's codes (``merge_digests``); the
    root's check suspects the two leaders as it would two nodes; a lost node travels up inside its group."""
    from ddp_doctor.diagnose.jobview import merge_digests
    from ddp_doctor.evidence import NodeLoss

    ar = Collective("world", 7, "all_reduce", ("4",), ("float32",), TRAIN)
    ag = Collective("world", 7, "all_gather", ("4",), ("float32",), TRAIN)
    views = _node_views({0: ar, 1: ar, 2: ag, 3: ag})
    check = CrossCheck()
    found = []
    for g, rs in enumerate(((0, 1), (2, 3))):
        s = Summarizer(node=0, digests=True).summary({r: views[r] for r in rs}, 2.0)
        loss = (NodeLoss(5, "h5", (9,), 16.0),) if g else ()
        merged = JobView(4, [(s, 0.0)], lost=loss).summary(g, 1, 2.0, digests=merge_digests(s.digests))
        assert merged.digests and merged.ranks == rs
        found += check.feed(merged)
        if g:
            assert merged.lost == loss and JobView(4, [(merged, 0.0)]).lost == loss
    assert [(f[0], f[2]) for f in found] == [("fingerprint", frozenset({0, 1}))]


def test_codes_leave_legal_differences_alone():
    src = Collective("world", 3, "broadcast", ("4",), ("float32",), Site("/u/t.py", 10, "main"))
    dst = Collective("world", 3, "broadcast", ("4",), ("float32",), Site("/u/t.py", 12, "main"))
    found, proof = _cross({0: src, 1: src, 2: dst, 3: dst})
    assert found == [] and proof is None  # the same collective from two branches
    # a DDP call at two lines, even one the other node never ran: the same collective as torch sees it
    a = Collective("world", 5, "ddp.forward(broadcast_buffers)", ("2",), ("float32",), Site("/u/t.py", 30, "main"))
    b = Collective("world", 5, "ddp.forward(broadcast_buffers)", ("2",), ("float32",), Site("/u/t.py", 31, "main"))
    found, proof = _cross({0: a, 1: a, 2: b, 3: b})
    assert found == [] and proof is None
    # all_to_all_single with per-rank split sizes: each rank's tensors differ by design
    a2a = {r: Collective("world", 9, "all_to_all_single", (f"{3 + r}x4", f"{5 - r}x4"), ("float32", "float32"), TRAIN)
           for r in range(4)}
    found, proof = _cross(a2a)
    assert found == [] and proof is None
    for r in (2, 3):
        a2a[r] = Collective("world", 9, "all_to_all_single", ("6x4", "2x4"), ("float64", "float64"), TRAIN)
    found, proof = _cross(a2a)
    assert found and proof is not None and proof.kind == "shape"  # a dtype torch requires to agree
    join = Collective("world", 5, "all_reduce", join=True)
    assert fp_code(join) == 0 and not codes_differ(0, fp_code(a))


def test_two_nodes_ranks_waiting_for_each_other_suspected_from_summaries_proven_from_states():
    """live's cycle across nodes: rank 0 (node 0) blocked in its node group's collective, rank 2 (node 1) in
    the world's gradient all-reduce; each is a member of the other's group and never entered its call."""
    from ddp_doctor.diagnose.live import CYCLE_S, group_ranks
    from ddp_doctor.evidence import GROUP_CREATION, NodeDetail
    from ddp_doctor.watcher.root import Root

    sub = Collective("pg:0,2", 3, "all_reduce", site=BAR, waiting_s=2.0, blocking=True)
    ar = Collective("world", 10, "ddp.backward(allreduce_grads)", site=TRAIN, waiting_s=2.0, blocking=True)
    states = {0: RankState(rank=0, t=50.0, in_collective=sub, seq={"pg:0,2": 4, "world": 10}),
              1: RankState(rank=1, t=50.0, in_collective=ar, seq={"world": 11}),
              2: RankState(rank=2, t=50.0, in_collective=ar, seq={"pg:0,2": 3, "world": 11}),
              3: RankState(rank=3, t=50.0, in_collective=ar, seq={"world": 11})}
    views = {}
    for r, st in states.items():
        views[r] = RankView(r)
        views[r].update(st, 10.0)
    sums = [Summarizer(node=k, digests=True).summary({r: views[r] for r in rs}, 10.0)
            for k, rs in enumerate(((0, 1), (2, 3)))]
    assert all(s.desync is None for s in sums)  # neither node alone can see it
    pairs = JobView(4, [(s, 0.0) for s in sums]).cycle_pairs(group_ranks, GROUP_CREATION, CYCLE_S)
    assert [nodes for _, nodes in pairs] == [frozenset({0, 1})]
    # the root shifts the pulled states onto its clock (node 1's launcher started 30 s after the root's)
    root = Root(None, None, 4, slot=0, t0=1000.0)
    moved = root.on_root_clock(NodeDetail(1, 1, "h", (states[2].with_(t=20.0),), t0=1030.0))
    assert moved[0].t == 50.0
    proof = find_desync({**views, 2: RankView.from_detail(moved[0], 10.0)}, 4)
    assert proof is not None and proof.kind == "cycle" and set(proof.calls) == {0, 2}


@pytest.fixture()
def stores():
    import torch.distributed as dist

    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))

    def client(timeout=10.0):
        return SideChannel(dist.TCPStore("127.0.0.1", server.port, is_master=False, wait_for_workers=False,
                                         timeout=timedelta(seconds=timeout)), secret=b"k")

    yield SideChannel(server, secret=b"k"), client


def test_a_late_node_is_not_a_stall_a_silent_one_is_lost(stores):
    """Every rank idle past the limit, but node 2's agent is late: no verdict until it is heard again (it then
    shows a sign of life) or it has been silent for LOST_S (lost: its ranks unwatched, their times stand)."""
    channel, client = stores
    root = Root(channel, client(1.0), 6, slot=int(channel.add("ddpd/nodes", 1)) - 1)
    judge = Judge(10.0)
    views = {r: RankView(r) for r in range(6)}
    ups = {1: Uplink(client()), 2: Uplink(client())}
    sums = {k: Summarizer(node=k, digests=True) for k in range(3)}
    members = {0: (0, 1), 1: (2, 3), 2: (4, 5)}
    t = 0.0
    sig = {r: 1 for r in range(6)}

    def tick(dt, *, silent=(), moving=()):
        nonlocal t
        end, verdict = t + dt, None
        while t < end and verdict is None:
            t = round(t + 0.2, 6)
            job = None
            for k, rs in members.items():
                for r in rs:
                    sig[r] += r in moving
                    views[r].update(RankState(rank=r, world_size=6, progress=9, in_collective=barrier(4),
                                              activity=Activity(0.0, 0, 0.0, sig[r])), t)
                s = sums[k].summary({r: views[r] for r in rs}, t, first_state_t=0.0)
                if k == 0:
                    own = s
                elif k not in silent:
                    ups[k].post(s, t)
            root.read(t)
            job = root.job_view(own, t)
            verdict = judge.decide_job(job, t)
        return verdict, job

    v, job = tick(3.0)
    assert v is None and root.slots.keys() == {1, 2}
    v, job = tick(10.0 + 2.0, silent=(2,))              # past the limit, but node 2 is late (not lost)
    assert v is None and job.late == (2,), job.late
    v, job = tick(0.4, moving=(4,))                      # heard again: it was alive
    assert v is None and job.late == () and not root.lost
    v, job = tick(LOST_S + 5, silent=(2,))
    assert v is not None and v.reason == "stalled"
    loss = root.lost[2]
    assert loss.ranks == (4, 5) and loss.silent_s > LOST_S and LATE_S < LOST_S


def test_the_scale_benchmark_meets_its_targets_at_256_ranks():
    """benchmarks/scale.py (simulated ranks, the real aggregation, encoding, store and decision, a tree of
    eight group leaders): a stuck rank is found within the limit + 2 s, named, at <= 2 requests per node per
    interval at every level."""
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "--ranks", "256", "--group-size", "4", "--limit", "4",
                          "--warmup", "3"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["nodes"] == 32 and r["leaders"] == 8 and r["verdict"] == "stalled", r   # a tree: 8 groups of 4 nodes
    assert r["root_requests_per_leader_per_interval"] <= 2.0 and r["group_requests_per_node_per_interval"] <= 2.0, r
    assert r["detect_latency_s"] <= r["limit_s"] + 2.0, r
    assert r["culprit_ok"], r
    assert 0 < r["bytes_per_s"] and 0 < r["watcher_cpu_s_per_s"], r


def test_thousands_of_ranks_doing_the_same_are_one_phrase():
    """A live warning and a finding's 'Meanwhile' name a large job's ranks by runs; small jobs' texts keep
    one phrase per rank."""
    from ddp_doctor.diagnose.common import others_text
    from ddp_doctor.evidence import Suspicion
    from ddp_doctor.report.terminal import suspicion_text

    c = Collective("world", 12, "all_reduce", site=BAR)
    big = {r: RankState(rank=r, in_collective=c) for r in range(10000) if r != 5007}
    big[5007] = RankState(rank=5007, where=EVAL)
    text = others_text(big, {5007})
    assert text == "ranks 0-5006, 5008-9999 each waits in all_reduce (#12 on world) at train.py:53 (main)", text
    small = {0: RankState(rank=0, in_collective=c), 1: RankState(rank=1, in_collective=c)}
    assert others_text(small, set()).startswith("rank 0 waits in all_reduce") and "; rank 1 waits" in others_text(small, set())
    warn = suspicion_text(Suspicion(12.0, {r: c for r in big if r != 5007}, {5007: EVAL}, {5007: 12.0}, 90.0))
    assert "ranks 0-5006, 5008-9999 wait in all_reduce (#12 on world)" in warn and "rank 5007 is outside" in warn
    assert len(warn) < 400


def test_a_silent_leaders_ranks_that_a_new_leader_reports_are_neither_late_nor_lost_twice(stores):
    """Leader A reported ranks 0-7 (its own node 0-3, another node 4-7) and went silent; the other node moved
    to leader B.  The root keeps A's summary of ranks 0-3 only: late, then lost; 4-7 are B's, counted once."""
    channel, client = stores
    root = Root(channel, client(1.0), 8, slot=-1)
    a, b = Uplink(client()), Uplink(client())
    views = {r: RankView(r) for r in range(8)}
    for r in range(8):
        views[r].update(RankState(rank=r, world_size=8, progress=5, in_collective=barrier(4)), 0.0)
    both = Summarizer(node=0).summary(views, 0.2, first_state_t=0.0)
    a.post(both, 0.2)
    root.read(0.2)
    t = 0.2
    while t < 20.0:
        t = round(t + 0.2, 6)
        b.post(Summarizer(node=1).summary({r: views[r] for r in range(4, 8)}, t, first_state_t=0.0), t)
        root.read(t)
        job = root.job_view(None, t)
        assert job.seen == 8, (t, job.seen)
        silent = t - 0.2
        if silent <= LATE_S:
            assert not job.late and not job.lost
        elif silent <= LOST_S:
            assert job.late == (0,) and not job.lost, t
    assert [x.ranks for x in job.lost] == [(0, 1, 2, 3)] and not job.late


def test_a_leader_passes_a_pull_down_to_the_node_that_holds_the_ranks_or_answers_for_its_own(stores):
    """The root asks a group leader for ranks' full states: the leader asks only the node of its group that
    holds them (ranks 4-7), or answers from its own node (ranks 0-3)."""
    import torch.distributed as dist

    from ddp_doctor import store as side
    from ddp_doctor.evidence import NodeDetail
    from ddp_doctor.watcher.tree import Leader

    channel, client = stores
    root = Root(channel, client(1.0), 8, slot=-1)
    g = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))

    def gclient(timeout=10.0):
        return SideChannel(dist.TCPStore("127.0.0.1", g.port, is_master=False, wait_for_workers=False,
                                         timeout=timedelta(seconds=timeout)), secret=b"k")

    gch = SideChannel(g, secret=b"k")
    leader = Leader(gch, gclient(1.0), Uplink(client()), 8, slot=int(gch.add(side.NODES, 1)) - 1)
    node = Uplink(gclient())
    views = {r: RankView(r) for r in range(8)}
    for r in range(8):
        views[r].update(RankState(rank=r, world_size=8, progress=5, where=TRAIN), 0.0)
    sums = [Summarizer(node=k, digests=True) for k in range(2)]
    asked: list[int] = []

    def own_detail(req, stacks):
        asked.append(req)
        return NodeDetail(0, req, "h0", tuple(views[r].state for r in range(4)))

    def tick(t):
        node.post(sums[1].summary({r: views[r] for r in range(4, 8)}, t, first_state_t=0.0), t)
        ctl = node.control()
        pull = node.pull_for_me(ctl) if ctl is not None else None
        if pull is not None:
            node.answer(NodeDetail(node.slot, pull.req, "h1", tuple(views[r].state for r in range(4, 8))))
        leader.tick(sums[0].summary({r: views[r] for r in range(4)}, t, first_state_t=0.0), {}, t, own_detail)
        root.read(t)

    t = 0.0
    for _ in range(6):
        t = round(t + 0.2, 6)
        tick(t)
    assert root.job_view(None, t).seen == 8
    for want, expect, own in (((6,), {6}, False), ((2,), {2}, True)):
        asked.clear()
        root.request(set(root.slots), stacks=False, ranks=want)
        for _ in range(12):
            t = round(t + 0.2, 6)
            tick(t)
            root.collect()
            if not root.wanted:
                break
        assert not root.wanted
        got = {st.rank for d in root.details.values() for st in d.ranks}
        assert got == expect and bool(asked) == own, (got, asked)
