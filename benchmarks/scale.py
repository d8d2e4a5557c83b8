"""Hierarchical watching at scale: N simulated ranks, the real aggregation, encoding and decision code.

No process per rank.  Every simulated rank is a real ``RankState`` (a fingerprint ring of 256 collectives,
step times, signs of life) that it encodes as its probe posts it to its node agent (``compact.StateEncoder``:
a base now and then, a delta of ~150 bytes plus its new fingerprints per interval); the agent decodes it
(``compact.StateDecoder``) into its real ``RankView`` and reduces its views to a summary
(``diagnose.summary.Summarizer``).  With ``--group-size G`` (default ``tree.GROUP_SIZE``) the nodes form a
tree (``watcher.tree``): each agent posts its summary, delta-encoded and signed, to its group's leader (the
first live node of G) through the group leader's store; each leader reads its group with the real
``watch.root.Root``, merges (``JobView.summary``) and posts one summary up through a real ``Uplink`` to the
root store; the root (``watch.root.Root``) reads every leader with one ``multi_get`` per interval and
decides with the one verdict policy (``diagnose.live.Judge``).  ``--group-size 0``: every node posts to the
root (the flat layout of issue 16).  The root -- the root store server, ``Root`` and ``Judge`` -- runs in
this process; every node agent and leader runs in one child process (the group leaders' stores are one
TCPStore server there, a key prefix per node), in lock step on a simulated clock (each tick the nodes post,
then their leaders read and post, then the root reads: every level reads the posts of the interval they were
made in, as the flat simulation did; a real tree adds up to one interval per level); the lock step uses keys
of its own, not counted.  The stores and every byte on them are real.

Scenarios (``--scenario``): ``stall``: after ``--warmup`` s one rank (the culprit, on a node that does not
lead) stops outside collectives and shows no sign of life; every other rank then waits in the next
all-reduce.  ``leader``: the same, and the culprit's group leader is lost 2 s into the run (its node and
its ranks vanish; its store refuses every call): its group must fail over and the culprit still be named.
``desync``: at the warm-up one rank issues the next all-reduce with another shape, at another line; every
rank then waits in it.  The run ends at the verdict; the root then pulls the suspected ranks' full states
(stacks included) down the tree, and ``diagnose()`` must name the culprit (DDP205, or DDP203) at its line.

A job of one node (8 ranks) is watched in-process, as ``ddp-doctor run`` watches it: no root store.

One JSON line per run (CPU is process or thread CPU time, never wall clock): ranks, nodes, leaders,
interval_s, root_requests_per_leader_per_interval (every request the root store served: the leaders'
posts and control reads, the root's reads; per node of that level, i.e. per leader, or per node when
flat), group_requests_per_node_per_interval (the same at the leaders' stores), bytes_per_s (at the root
store), watcher_cpu_s_per_s (the root process: its loop plus its store server, ``time.process_time``;
root_loop_cpu_s_per_s is the loop's ``thread_time``), leader_cpu_s_per_s (one leader: reading, merging,
posting its group, besides its own node), node_agent_cpu_s_per_s (one node agent of 8 ranks: decoding its
ranks' posts, its views, its summary, encoding and posting it), rank_post_cpu_s_per_s (one rank: encoding
its posts), limit_s, detect_latency_s (from the stall to the verdict, simulated clock), culprit_ok.

    PYTHONPATH=src nice -n 10 python benchmarks/scale.py --ranks 1000 --ranks 10000 --ranks 100000
    PYTHONPATH=src nice -n 10 python benchmarks/scale.py --ranks 100000 --scenario leader --scenario desync
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from datetime import timedelta

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "src"))

from ddp_doctor.channel import SECRET_ENV, SideChannel, new_secret  # noqa: E402
from ddp_doctor.diagnose import diagnose  # noqa: E402
from ddp_doctor.diagnose.jobview import LOST_S  # noqa: E402
from ddp_doctor.diagnose.live import Judge  # noqa: E402
from ddp_doctor.diagnose.summary import Summarizer  # noqa: E402
from ddp_doctor.evidence import (Activity, Collective, JobEvidence, NodeDetail, RankState, Site,  # noqa: E402
                                 SiteCount, ThreadStack)
from ddp_doctor.evidence.compact import StateDecoder, StateEncoder  # noqa: E402
from ddp_doctor.probe.publisher import INTERVAL as PUBLISH_S  # noqa: E402
from ddp_doctor.watcher.root import Root, interval_for  # noqa: E402
from ddp_doctor.watcher.tree import GROUP_SIZE, GroupLink, group_of  # noqa: E402
from ddp_doctor.watcher.uplink import Uplink  # noqa: E402
from ddp_doctor.watcher.views import RankView  # noqa: E402

TRAIN = Site("/job/train.py", 41, "train_step")
STEP = Site("/job/train.py", 44, "train_step")
LOSS = Site("/job/train.py", 47, "train_step")
STUCK = Site("/job/data.py", 88, "read_shard")
OPS = (("ddp.forward(broadcast_buffers)", ("2",), ("float32",), TRAIN),
       ("ddp.backward(allreduce_grads)", ("4096",), ("float32",), STEP),
       ("ddp.backward(allreduce_grads)", ("1024",), ("float32",), STEP),
       ("all_reduce", ("1",), ("float32",), LOSS))
RING = 256
STEPS_PER_EPOCH = 400


class Schedule:
    """The job's collectives by position, shared by every rank (equal fingerprints are one object)."""

    def __init__(self) -> None:
        self.fps: list[Collective] = []

    def upto(self, n: int) -> tuple[Collective, ...]:
        while len(self.fps) < n:
            s = len(self.fps)
            step = s // len(OPS)
            op, shapes, dtypes, site = OPS[s % len(OPS)]
            self.fps.append(Collective("world", s, op, shapes, dtypes, site, epoch=step // STEPS_PER_EPOCH,
                                       step_in_epoch=step % STEPS_PER_EPOCH))
        return tuple(self.fps[max(0, n - RING):n])


class SimRank:
    """One rank's counters; ``state(now)`` is what its probe would publish."""

    def __init__(self, rank: int, local_rank: int, node: int, world: int) -> None:
        self.rank, self.local_rank, self.node, self.world = rank, local_rank, node, world
        self.seq = 0
        self.cpu = 0.0
        self.sig = 1
        self.stuck = False
        self.odd: Collective | None = None    # desync: this rank's call at that position differs
        self.waiting_since: float | None = None
        self.sites = (SiteCount(OPS[0][0], TRAIN, 1), SiteCount(OPS[1][0], STEP, 2), SiteCount(OPS[3][0], LOSS, 1))
        self.encoder = StateEncoder()
        self.posted = -1

    def state(self, now: float, sched: Schedule, stalled_at: int | None) -> RankState:
        sched.upto(max(self.seq, stalled_at or 0) + 2)
        in_coll = None
        where = TRAIN
        if self.stuck:
            where = STUCK
        elif stalled_at is not None:
            self.seq = stalled_at + 1          # entered the collective the culprit never reaches (or the odd one)
            if self.waiting_since is None:
                self.waiting_since = now
                self.sig += 1
            f = self.odd or sched.fps[stalled_at]
            in_coll = Collective(f.group, f.seq, f.op, f.shapes, f.dtypes, f.site, "user",
                                 round(now - self.waiting_since, 3))
        else:
            self.cpu = now * 0.75   # a busy training thread
            self.sig += 1
            if self.rank % 5 == 0 and self.seq:  # a few ranks are caught inside their current collective
                f = sched.fps[self.seq - 1]
                in_coll = Collective(f.group, f.seq, f.op, f.shapes, f.dtypes, f.site, "user", 0.01)
        step = self.seq // len(OPS)
        fps = sched.upto(self.seq) if self.seq else ()
        if self.odd is not None:
            fps = tuple(self.odd if f.seq == self.odd.seq else f for f in fps)
        return RankState(
            rank=self.rank, local_rank=self.local_rank, host=f"node{self.node}", pid=1000 + self.rank,
            world_size=self.world, epoch=step // STEPS_PER_EPOCH, step=step, step_in_epoch=step % STEPS_PER_EPOCH,
            progress=self.seq + step, steps_by_epoch=(STEPS_PER_EPOCH,) * (step // STEPS_PER_EPOCH),
            step_times=(0.2,) * 50, cpu_s=self.cpu, activity=Activity(self.cpu, 0, 0.0, self.sig),
            pg_timeout_s=1800.0, where=where, in_collective=in_coll, seq={"world": self.seq}, fingerprints=fps,
            site_counts=self.sites, coll_count=self.seq)

    def post(self, now: float, sched: Schedule, stalled_at: int | None) -> tuple[bytes | None, bytes] | None:
        """What the rank's probe posts to its node agent (a base now and then, a delta), every
        ``publisher.INTERVAL`` as the probe does; None when it has not posted since the agent's last look."""
        k = int(now / PUBLISH_S + 1e-9)
        if k == self.posted:
            return None
        self.posted = k
        return self.encoder.encode(self.state(now, sched, stalled_at), now)


class SimNode:
    """A node agent: its ranks' posts decoded into its views, its summarizer, its link up (an ``Uplink`` to
    the root, or a ``GroupLink`` into the tree)."""

    def __init__(self, node: int, ranks: list[SimRank], link=None) -> None:
        self.node = node
        self.ranks = ranks
        self.views = {r.rank: RankView(r.rank) for r in ranks}
        self.decoders = {r.rank: StateDecoder() for r in ranks}
        self.summarizer = Summarizer(node=node, digests=True)
        self.link = link
        self.first_t: float | None = None
        self.summary = None
        self.rank_cpu = 0.0      # the ranks' own encoding (not the agent's work)

    def tick(self, now: float, sched: Schedule, stalled_at: int | None):
        for r in self.ranks:
            c0 = time.thread_time()
            post = r.post(now, sched, stalled_at)
            self.rank_cpu += time.thread_time() - c0
            if post is None:
                continue  # (the agent reads a post once, however often it looks)
            base, delta = post
            dec = self.decoders[r.rank]
            if base is not None:
                dec.set_base(base)
            st = dec.decode(delta)
            if st is not None:
                self.views[r.rank].update(st, now)
        self.first_t = self.first_t if self.first_t is not None else now
        self.summary = self.summarizer.summary(self.views, now, first_state_t=self.first_t, host=f"node{self.node}")
        if self.link is not None:
            self.link.post(self.summary, now)
            self.obey(now)
        return self.summary

    def obey(self, now: float) -> None:
        ctl = self.link.control()
        if ctl is not None:
            pull = self.link.pull_for_me(ctl)
            if pull is not None:
                self.link.answer(self.detail(pull.req, now))

    def detail(self, req: int, now: float) -> NodeDetail:
        """What the agent sends when pulled: every rank's full state with its stack (simulated frames)."""
        out = []
        for r in self.ranks:
            v = self.views[r.rank]
            st = v.state
            if st is None:
                continue
            frames = (Site("/job/train.py", 90, "<module>"), st.where or TRAIN)
            out.append(st.with_(stack=frames, threads=(ThreadStack("MainThread", True, frames),), busy=v.busy(now),
                                stalled_s=round(now - v.progress_t, 2), idle_s=round(v.idle_s(now), 2),
                                sites_seen=frozenset(v.sites_seen)))
        return NodeDetail(self.node, req, f"node{self.node}", tuple(out))


class MirrorNode(SimNode):
    """A healthy node past ``--full-nodes``: its summary is the reference node's (a full node, healthy, at the
    same position) with its own ranks, host and slot -- so 100,000 ranks fit this box.  What it posts (its own
    delta encoding, signed, to its own leader) and everything above it are real; a node agent's own cost
    does not depend on the job's size and is measured on the full nodes."""

    def __init__(self, node: int, ranks: list[SimRank], ref: SimNode, link=None) -> None:
        super().__init__(node, ranks, link)
        self.ref = ref
        self.shift = ranks[0].rank - ref.ranks[0].rank

    def tick(self, now: float, sched: Schedule, stalled_at: int | None):
        self.summary = shifted(self.ref.summary, self.shift).with_(node=self.node, host=f"node{self.node}")
        if self.link is not None:
            self.link.post(self.summary, now)
            self.obey(now)
        return self.summary

    def detail(self, req: int, now: float) -> NodeDetail:
        d = self.ref.detail(req, now)
        return NodeDetail(self.node, req, f"node{self.node}",
                          tuple(st.with_(rank=st.rank + self.shift, host=f"node{self.node}") for st in d.ranks))


def shifted(s, k: int):
    """A summary with every rank number moved by ``k`` (the mirror nodes' own ranks)."""
    from ddp_doctor.evidence import Finished, Outside, Waiting

    def rs(xs):
        return tuple(r + k for r in xs)

    return s.with_(ranks=rs(s.ranks), live=rs(s.live), failed=rs(s.failed), busy=rs(s.busy),
                   finished=tuple(Finished(f.seq, rs(f.ranks)) for f in s.finished),
                   waiting=tuple(Waiting(w.coll, rs(w.ranks)) for w in s.waiting),
                   outside=tuple(Outside(o.rank + k, o.where, o.idle_s) for o in s.outside),
                   deadline=None if s.deadline is None else s.deadline.__class__(s.deadline.rank + k, s.deadline.coll,
                                                                                 s.deadline.timeout_s))


STEPS_PER_S = 5.0
SYNC = "bench/"          # the benchmark's own lock-step keys (not ddp-doctor traffic; not counted)
LEADER_LOST_T = 1.0     # the "leader" scenario: when the culprit's group leader is lost
ODD = Site("/job/train.py", 61, "eval_step")   # the desync: the culprit's call, at its line


def _client(port: int, timeout_s: float = 600.0):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


class Gone(Exception):
    """A lost node's store: every call refused (the simulated death of a group leader)."""


class _Gate:
    """One node's group store as its peers reach it (a key prefix on the child's group-store server), and
    its death: once the node is in ``dead`` every call raises, as a closed port would."""

    def __init__(self, store, node: int, dead: set[int]) -> None:
        self.store, self.node, self.dead = store, node, dead

    def __getattr__(self, name):
        fn = getattr(self.store, name)

        def call(*a, **kw):
            if self.node in self.dead:
                raise Gone(f"node {self.node} is lost")
            return fn(*a, **kw)
        return call


def nodes_process(port: int, secret: str, n_ranks: int, per_node: int, group_size: int, interval: float,
                  warmup: float, culprit_rank: int, scenario: str, full_nodes: int) -> None:
    """The child: every node agent (and group leader) of the job, ticking on the simulated clock in lock step
    with the root."""
    import torch.distributed as dist

    os.environ[SECRET_ENV] = secret
    sync = _client(port)
    client = _client(port, 30.0)
    n_nodes = math.ceil(n_ranks / per_node)
    sched = Schedule()
    ranks = [SimRank(r, r % per_node, r // per_node, n_ranks) for r in range(n_ranks)]
    culprit = ranks[culprit_rank]
    key = secret.encode()
    root_channels: list[SideChannel] = []
    group_channels: list[SideChannel] = []
    dead: set[int] = set()

    def up() -> Uplink:
        ch = SideChannel(client, secret=key)
        root_channels.append(ch)
        return Uplink(ch)

    # full nodes: the first ``full_nodes`` and the culprit's group; the others mirror node 1 (healthy, never
    # a leader's node in a tree, never the culprit's)
    culprit_group = set(group_of(culprit.node, n_nodes, group_size)) if group_size else {culprit.node}
    ref_k = 1

    def make(k: int, link=None) -> SimNode:
        rs = ranks[k * per_node:(k + 1) * per_node]
        if k < max(2, full_nodes) or k in culprit_group:
            return SimNode(k, rs, link)
        return MirrorNode(k, rs, nodes[ref_k], link)

    nodes: list[SimNode] = []
    if group_size:
        gserver = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
        gclient = _client(gserver.port, 30.0)

        def group_store(j: int) -> SideChannel:
            ch = SideChannel(_Gate(dist.PrefixStore(f"n{j}/", gclient), j, dead), secret=key)
            group_channels.append(ch)
            return ch

        for k in range(n_nodes):
            own = group_store(k)
            node = make(k)
            node.link = GroupLink(k, group_of(k, n_nodes, group_size), group_store, own, own, up, n_ranks,
                                  host=f"node{k}", own_views=(lambda n=node: n.views),
                                  own_detail=(lambda req, stacks, n=node: n.detail(req, now)))
            node.link.on_failover = node.summarizer.sent.clear  # the new leader gets the last window's codes
            nodes.append(node)
    else:
        for k in range(n_nodes):
            nodes.append(make(k, up()))
    lost_node = None
    if scenario == "leader":  # the culprit's group leader
        lost_node = group_of(culprit.node, n_nodes, group_size)[0]
    now, stalled_at, k = 0.0, None, 0
    window = None          # (root requests, group requests, bytes) at the start of the measured window
    node_cpu = leader_cpu = rank_cpu = 0.0
    node_ticks = leader_ticks = full_ranks_ticks = 0

    def counts():
        return (sum(c.stats.requests for c in root_channels), sum(c.stats.requests for c in group_channels),
                sum(c.stats.bytes_in + c.stats.bytes_out for c in root_channels))

    def leading(n: SimNode) -> bool:
        return isinstance(n.link, GroupLink) and n.link.leading

    while True:
        k += 1
        now = round(now + interval, 6)
        pos = int(now * STEPS_PER_S) * len(OPS)  # the job trains STEPS_PER_S steps a second
        for r in ranks:
            if stalled_at is None and not r.stuck:
                r.seq = pos
        if lost_node is not None and now >= LEADER_LOST_T and lost_node not in dead:
            dead.add(lost_node)
        if stalled_at is None and now >= warmup:
            stalled_at = culprit.seq
            if scenario == "desync":
                f = sched.upto(stalled_at + 1)[-1]
                culprit.odd = Collective(f.group, f.seq, f.op, ("3",), f.dtypes, ODD, epoch=f.epoch,
                                         step_in_epoch=f.step_in_epoch)
            else:
                culprit.stuck = True
        if window is None and now >= 2.0:  # from the first summaries on (registration done)
            window = counts()
        # the reference node first (its mirrors post its summary), then the other nodes, then the leaders: each
        # level reads the posts of the interval they were made in, as the root does (and as the flat simulation
        # of issue 16 did); a real tree adds up to one interval per level
        for n in sorted((n for n in nodes if n.node not in dead), key=lambda n: (n.node != ref_k, leading(n))):
            lead = leading(n)
            r0 = n.rank_cpu
            c0 = time.thread_time()
            n.tick(now, sched, stalled_at)
            spent = time.thread_time() - c0 - (n.rank_cpu - r0)
            if window is not None and not isinstance(n, MirrorNode):
                rank_cpu += n.rank_cpu - r0
                full_ranks_ticks += len(n.ranks)
                if lead:
                    leader_cpu += spent
                    leader_ticks += 1
                else:
                    node_cpu += spent
                    node_ticks += 1
        sync.set(f"{SYNC}tick/{k}", json.dumps([now]))
        sync.wait([f"{SYNC}go/{k}"])
        if sync.get(f"{SYNC}go/{k}") != b"on":
            break
    end = counts()
    leaders = [n for n in nodes if n.node not in dead and leading(n)]
    stats = {"root_requests": end[0] - window[0], "group_requests": end[1] - window[1], "bytes": end[2] - window[2],
             "node_cpu_per_tick": node_cpu / max(1, node_ticks), "leader_cpu_per_tick": leader_cpu / max(1, leader_ticks),
             "rank_cpu_per_tick": rank_cpu / max(1, full_ranks_ticks), "leaders": len(leaders),
             "full_nodes": sum(not isinstance(n, MirrorNode) for n in nodes),
             "failovers": sum(n.link.failovers for n in nodes if isinstance(n.link, GroupLink))}
    sync.set(f"{SYNC}stats", json.dumps(stats))
    # the pull: the leaders keep ticking (they pass the root's pull down and the answers up), every other
    # node reads its control message as on its next intervals and answers what it is asked
    while not sync.check([f"{SYNC}stop"]):
        now = round(now + interval, 6)
        for n in nodes:
            if n.node in dead:
                continue
            if leading(n):
                n.tick(now, sched, stalled_at)
            else:
                n.obey(now)
        time.sleep(0.02)


def warmup_tick(now: float, warmup: float, interval: float) -> float:
    """The simulated time of the first tick at or after the warm-up: the stall."""
    return round(math.ceil(warmup / interval - 1e-9) * interval, 6)


def run_one_node(n_ranks: int, interval: float, limit: float, warmup: float) -> dict:
    """A job on one node is watched as ``ddp-doctor run`` watches it: the node decides from the summary of its
    own views, in-process; nothing goes to a root store."""
    from ddp_doctor.diagnose.jobview import JobView

    sched = Schedule()
    ranks = [SimRank(r, r, 0, n_ranks) for r in range(n_ranks)]
    culprit = ranks[-1]
    node = SimNode(0, ranks, None)
    judge = Judge(limit)
    now, stalled_at, verdict, cpu, t0 = 0.0, None, None, 0.0, None
    while verdict is None and now < warmup + limit + 60:
        now = round(now + interval, 6)
        for r in ranks:
            if stalled_at is None and not r.stuck:
                r.seq = int(now * STEPS_PER_S) * len(OPS)
        if stalled_at is None and now >= warmup:
            culprit.stuck, stalled_at = True, culprit.seq
        c0, r0 = time.thread_time(), node.rank_cpu
        s = node.tick(now, sched, stalled_at)
        verdict = judge.decide_job(JobView(n_ranks, [(s, 0.0)]), now)
        if now >= 2.0:
            t0 = now if t0 is None else t0
            cpu += time.thread_time() - c0 - (node.rank_cpu - r0)   # (the ranks' own encoding: theirs)
    ok = False
    if verdict is not None:
        ev = JobEvidence(n_ranks, {st.rank: st for st in node.detail(0, now).ranks}, now, limit, "--hang-timeout")
        _, findings = diagnose(ev, verdict)
        ok = culprit_ok(findings, "stall", culprit.rank)
    watched = now - t0 + interval   # (from the interval at t0 to the verdict's, both included)
    return {"ranks": n_ranks, "nodes": 1, "interval_s": interval, "root_requests_per_node_per_interval": 0.0,
            "bytes_per_s": 0, "watcher_cpu_s_per_s": round(cpu / watched, 4), "root_loop_cpu_s_per_s": round(cpu / watched, 4),
            "store_server_cpu_s_per_s": 0.0, "node_agent_cpu_s_per_s": round(cpu / watched, 4), "limit_s": limit,
            "detect_latency_s": None if verdict is None else round(now - warmup_tick(0.0, warmup, interval), 2),
            "verdict": None if verdict is None else verdict.reason, "culprit": culprit.rank, "culprit_ok": ok,
            "pulled": 0, "scenario": "stall"}


def culprit_ok(findings, scenario: str, culprit: int) -> bool:
    """The diagnosis names the culprit first, at its line: DDP205 at the stuck line, or DDP203 at the odd call."""
    if not findings:
        return False
    f = findings[0]
    code, line = ("DDP203", ODD.line) if scenario == "desync" else ("DDP205", STUCK.line)
    return f.code == code and culprit in f.ranks and f.location is not None and f.location.line == line


def run(n_ranks: int, per_node: int, group_size: int, interval: float | None, limit: float, warmup: float,
        scenario: str = "stall", full_nodes: int = 10 ** 9) -> dict:
    import multiprocessing as mp

    import torch.distributed as dist

    n_nodes = math.ceil(n_ranks / per_node)
    group_size = group_size if n_nodes > 1 else 0
    if scenario == "leader":
        # the policy never stops a job while one of its nodes is late: the lost leader's own node has to be
        # declared lost (LOST_S after its last word) before the stall's limit runs out
        warmup = max(warmup, LEADER_LOST_T + LOST_S - limit + 1.0)
    n_top = math.ceil(n_nodes / group_size) if group_size else n_nodes   # the nodes the root reads
    interval = interval or interval_for(n_top)
    if n_nodes == 1:
        return run_one_node(n_ranks, interval, limit, warmup)
    secret = os.environ.get(SECRET_ENV) or new_secret()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    port = server.port
    root_channel = SideChannel(server, secret=secret.encode())
    reader = SideChannel(_client(port, 1.0), secret=secret.encode())
    sync = _client(port)
    # the culprit: the last rank of a middle node that does not lead its group
    node = n_nodes // 2
    if group_size and node % group_size == 0:
        node += 1
    culprit = min(n_ranks - 1, node * per_node + per_node - 1)
    child = mp.get_context("spawn").Process(target=nodes_process, daemon=True,
                                            args=(port, secret, n_ranks, per_node, group_size, interval, warmup,
                                                  culprit, scenario, full_nodes))
    child.start()
    # the root: no node of its own here (the child simulates every node, the root's included, and all of
    # them post: one request more per interval than a real root node, whose own summary stays in-process)
    root = Root(root_channel, reader, n_ranks, slot=-1)
    judge = Judge(limit)
    t_stall = warmup_tick(0.0, warmup, interval)
    verdict, job, k = None, None, 0
    root_cpu = 0.0
    p0 = m0 = t0 = None
    window = None
    while verdict is None:
        k += 1
        sync.wait([f"{SYNC}tick/{k}"])
        now = json.loads(sync.get(f"{SYNC}tick/{k}"))[0]
        if p0 is None and now >= 2.0:
            p0, m0, t0 = time.process_time(), time.thread_time(), now
            window = (sum(c.stats.requests for c in (root_channel, reader)),
                      sum(c.stats.bytes_in + c.stats.bytes_out for c in (root_channel, reader)))
        c0 = time.thread_time()
        root.read(now)
        root.confirm({}, now)
        job = root.job_view(None, now)
        verdict = judge.decide_job(job, now)
        if p0 is not None:
            root_cpu += time.thread_time() - c0
        if verdict is None and now > warmup + limit + 60:
            break
        sync.set(f"{SYNC}go/{k}", b"on" if verdict is None else b"off")
    t_verdict = now
    process_cpu = time.process_time() - p0
    main_cpu = time.thread_time() - m0
    root_requests = sum(c.stats.requests for c in (root_channel, reader)) - window[0]
    root_bytes = sum(c.stats.bytes_in + c.stats.bytes_out for c in (root_channel, reader)) - window[1]
    if verdict is None:
        sync.set(f"{SYNC}go/{k}", b"off")
    sync.wait([f"{SYNC}stats"])
    nodes_stats = json.loads(sync.get(f"{SYNC}stats"))
    # the diagnosis: the suspected ranks' full states and stacks (down the tree), the others from the summaries
    ok, pulled, lost = False, set(), []
    if verdict is not None:
        pulled = root.suspected(verdict, job)
        root.request(pulled, stacks=True, ranks=root.suspected_ranks(verdict, job))
        root.wait(pulled, 60.0)
        states = root.light_states()
        for v in root.remote_views(now).values():
            states[v.rank] = v.state.with_(stack=v.stack, threads=v.threads, sites_seen=frozenset(v.sites_seen))
        ev = JobEvidence(n_ranks, dict(sorted(states.items())), now, limit, "--hang-timeout")
        _, findings = diagnose(ev, verdict)
        ok = culprit_ok(findings, scenario, culprit)
        lost = sorted({r for x in job.lost for r in x.ranks})
    sync.set(f"{SYNC}stop", b"1")
    child.join(30)
    # the window holds the intervals from the one at t0 to the verdict's, both included
    ticks = round((t_verdict - t0) / interval) + 1
    watched_s = ticks * interval
    top = nodes_stats["leaders"] if group_size else n_nodes
    requests = root_requests + nodes_stats["root_requests"]
    return {
        "ranks": n_ranks, "nodes": n_nodes, "group_size": group_size, "leaders": nodes_stats["leaders"],
        "scenario": scenario, "interval_s": interval,
        "root_requests_per_leader_per_interval": round(requests / top / ticks, 3),
        "root_requests_per_node_per_interval": round(requests / n_nodes / ticks, 3),
        "group_requests_per_node_per_interval": round(nodes_stats["group_requests"] / n_nodes / ticks, 3),
        "bytes_per_s": round((root_bytes + nodes_stats["bytes"]) / watched_s),
        "watcher_cpu_s_per_s": round(process_cpu / watched_s, 4),
        "root_loop_cpu_s_per_s": round(root_cpu / watched_s, 4),
        "store_server_cpu_s_per_s": round((process_cpu - main_cpu) / watched_s, 4),
        "leader_cpu_s_per_s": round(nodes_stats["leader_cpu_per_tick"] / interval, 4) if group_size else None,
        "node_agent_cpu_s_per_s": round(nodes_stats["node_cpu_per_tick"] / interval, 4),
        "rank_post_cpu_s_per_s": round(nodes_stats["rank_cpu_per_tick"] / interval, 5),
        "full_nodes": nodes_stats["full_nodes"],
        "limit_s": limit, "warmup_s": warmup,
        "detect_latency_s": None if verdict is None else round(t_verdict - t_stall, 2),
        "verdict": None if verdict is None else verdict.reason, "culprit": culprit, "culprit_ok": ok,
        "pulled": len(pulled), "failovers": nodes_stats["failovers"], "lost_ranks": len(lost),
    }


def agent_main(argv) -> int:
    """One node agent as a real process on the wall clock (``tests/run/test_tree_processes.py``): it hosts its
    group store, says where on the root store, simulates its ranks on the job's clock (``bench/start`` on the
    root store, wall time) and joins the tree through ``GroupLink``; it leads when its group says so."""
    from ddp_doctor import store as side
    from ddp_doctor.watcher.tree import address_of, publish_address

    ap = argparse.ArgumentParser()
    ap.add_argument("--node", type=int, required=True)
    ap.add_argument("--nodes", type=int, required=True)
    ap.add_argument("--ranks-per-node", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=3)
    ap.add_argument("--root", required=True, help="host:port of the root store")
    ap.add_argument("--culprit", type=int, required=True)
    ap.add_argument("--stall-at", type=float, required=True, help="seconds after the job's start")
    ap.add_argument("--interval", type=float, default=0.2)
    a = ap.parse_args(argv)
    host, port = side.split_address(a.root)
    own, gport = side.host_store(0, interface="127.0.0.1")
    rootc = side.join_store(host, port, deadline_s=2.0)
    publish_address(rootc, a.node, f"127.0.0.1:{gport}")
    rootc.add(f"{SYNC}ready", 1)
    reader = SideChannel(side.tcp_client("127.0.0.1", gport, 1.0), secret=own.secret)
    world = a.nodes * a.ranks_per_node
    ranks = [SimRank(r, r % a.ranks_per_node, a.node, world)
             for r in range(a.node * a.ranks_per_node, (a.node + 1) * a.ranks_per_node)]
    node = SimNode(a.node, ranks)
    peers: dict[int, SideChannel] = {}

    def connect(j: int) -> SideChannel:
        addr = None
        while addr is None:
            addr = address_of(rootc, j)
            time.sleep(0 if addr else 0.1)
        h, p = side.split_address(addr)
        peers[j] = side.join_store(h, p, timeout_s=5.0, deadline_s=1.0)
        return peers[j]

    now = 0.0
    node.link = GroupLink(a.node, group_of(a.node, a.nodes, a.group_size), connect, own, reader,
                          lambda: Uplink(side.join_store(host, port, deadline_s=2.0)), world, host=f"node{a.node}",
                          own_views=lambda: node.views, own_detail=lambda req, stacks: node.detail(req, now))
    node.link.on_failover = node.summarizer.sent.clear
    start = None
    while start is None:
        raw = rootc.peek(f"{SYNC}start")
        start = float(raw) if raw else None
        time.sleep(0 if start else 0.05)
    sched = Schedule()
    stalled_at = None
    culprit = next((r for r in ranks if r.rank == a.culprit), None)
    while not rootc.check([f"{SYNC}stop"]):
        t = time.time() - start
        now = time.monotonic()
        if t >= 0:
            if stalled_at is None and t >= a.stall_at:
                stalled_at = int(a.stall_at * STEPS_PER_S) * len(OPS)
                if culprit is not None:
                    culprit.stuck = True
                    culprit.seq = stalled_at
            for r in ranks:
                if stalled_at is None:
                    r.seq = int(t * STEPS_PER_S) * len(OPS)
            node.tick(now, sched, stalled_at)
        time.sleep(a.interval)
    return 0


def agent_side_by_side(ticks: int = 300, interval: float = 0.2, per_node: int = 8) -> dict:
    """One node agent of ``per_node`` ranks as ``ddp-doctor run`` runs it now and as it ran before issue 38's
    agent work, fed the same simulated ranks, alternating every interval in this process (so both see the
    same load).  Each has its own real TCPStore (this process hosts it, as the agent does) and a real
    ``Watcher`` that reads its ranks' signed posts (``read_states``), its ``Summarizer``, and a real ``Uplink``
    posting the summary to a third store.  Now: the ranks post compact deltas (``Publisher.publish``'s
    encoding) and the summary compares only new positions.  Before: each rank posts its full state's JSON
    every interval and the summary compares every position the views keep (``find_desync`` over all).
    Agent CPU: the watcher thread's ``thread_time`` (reads, decoding, views, summary, uplink) plus the store
    servers' threads (the process's CPU beside it); a rank's own encoding and posts are not counted."""
    import tempfile

    import torch.distributed as dist

    from ddp_doctor import store as side
    from ddp_doctor.evidence import to_wire
    from ddp_doctor.watcher import Watcher

    secret = new_secret().encode()

    def server():
        st = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
        return st, SideChannel(_client(st.port, 5.0), secret=secret)

    up_server, _ = server()
    sched = Schedule()
    run_dir = tempfile.mkdtemp(prefix="ddpd-scale-")
    agents = {}
    for name in ("now", "before"):
        st, rank_side = server()
        watcher = Watcher(SideChannel(_client(st.port, 5.0), secret=secret), world_size=per_node * 2,
                          hang_timeout=None, run_dir=run_dir, local_world=per_node,
                          uplink=Uplink(SideChannel(_client(up_server.port, 5.0), secret=secret)))
        if name == "before":
            watcher.summarizer._window = lambda views: None   # every position compared, as before
        ranks = [SimRank(per_node + i, i, 1, per_node * 2) for i in range(per_node)]
        agents[name] = (st, rank_side, watcher, ranks, {"agent": 0.0, "server": 0.0})

    def post(name: str, r: SimRank, now: float) -> None:
        rank_side = agents[name][1]
        st = r.state(now, sched, None)
        key = side.local_key(r.local_rank)
        if name == "before":
            rank_side.set(key, to_wire(st))
            return
        base, delta = r.encoder.encode(st, now)
        if base is not None:
            rank_side.set(side.state_base_key(key), base)
        rank_side.set(key, delta)

    now = 0.0
    for k in range(ticks + 20):
        now = round(now + interval, 6)
        for name, (_, _, watcher, ranks, cpu) in agents.items():
            for r in ranks:
                r.seq = int(now * STEPS_PER_S) * len(OPS)
                if int(now / PUBLISH_S + 1e-9) != r.posted:
                    r.posted = int(now / PUBLISH_S + 1e-9)
                    post(name, r, now)
            p0, c0 = time.process_time(), time.thread_time()
            watcher.read_states()
            t = time.monotonic()
            watcher.node_summary = watcher.summarizer.summary(watcher.views, t, first_state_t=watcher.first_state_t)
            watcher.uplink.post(watcher.node_summary, t)
            watcher.uplink.control()
            agent = time.thread_time() - c0
            if k >= 20:   # (past the first bases)
                cpu["agent"] += agent
                cpu["server"] += max(0.0, time.process_time() - p0 - agent)
    out = {"agent_side_by_side": True, "ranks_per_node": per_node, "interval_s": interval, "ticks": ticks}
    for name, (st, _, _, _, cpu) in agents.items():
        out[f"agent_{name}_cpu_s_per_s"] = round((cpu["agent"] + cpu["server"]) / (ticks * interval), 5)
        out[f"agent_{name}_watcher_cpu_s_per_s"] = round(cpu["agent"] / (ticks * interval), 5)
        out[f"agent_{name}_store_cpu_s_per_s"] = round(cpu["server"] / (ticks * interval), 5)
    out["ratio_now_to_before"] = round(out["agent_now_cpu_s_per_s"] / max(1e-9, out["agent_before_cpu_s_per_s"]), 3)
    return out


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["agent"]:
        return agent_main(argv[1:])
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, action="append", help="simulated ranks (repeat for several runs)")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--group-size", type=int, default=GROUP_SIZE, help="nodes per group leader (0: flat, every "
                    "node posts to the root)")
    ap.add_argument("--scenario", action="append", choices=("stall", "leader", "desync"),
                    help="what goes wrong (repeat for several runs; default: stall)")
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between summaries (default: ddp-doctor's own for the nodes the root reads)")
    ap.add_argument("--full-nodes", type=int, default=200, help="nodes whose ranks are simulated one by one (and "
                    "the culprit's group); the other nodes post the summary of a healthy full node, relabelled")
    ap.add_argument("--limit", type=float, default=10.0, help="the hang limit (--hang-timeout, s)")
    ap.add_argument("--warmup", type=float, default=5.0, help="healthy training before the stall (s)")
    ap.add_argument("--agent", action="store_true", help="first, one node agent of --ranks-per-node ranks as it "
                    "is and as it was before (full JSON posts, every position compared), side by side")
    ap.add_argument("--agent-ticks", type=int, default=300, help="intervals of the side-by-side agent run")
    a = ap.parse_args(argv)
    if a.agent:
        print(json.dumps(agent_side_by_side(a.agent_ticks, 0.2, a.ranks_per_node)), flush=True)
        if not a.ranks:
            return 0
    for n in a.ranks or [8]:
        for sc in a.scenario or ["stall"]:
            r = run(n, a.ranks_per_node, a.group_size, a.interval, a.limit, a.warmup, sc, a.full_nodes)
            print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
