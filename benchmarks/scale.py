"""Hierarchical watching at scale: N simulated ranks, the real aggregation, encoding and decision code.

No process per rank.  Every simulated rank is a real ``RankState`` (a fingerprint ring of 256 collectives,
step times, signs of life) fed to its node agent's real ``RankView`` each interval, as the agent would read
it from its node's store; the agent reduces its views to a summary (``diagnose.summary.Summarizer``) and
posts it, delta-encoded and signed, through a real ``watch.uplink.Uplink`` to a real in-process TCPStore
(the root store); the root (``watch.root.Root``) reads every node's summary with one ``multi_get`` per
interval, checks fingerprint codes across nodes and decides with the one verdict policy
(``diagnose.live.Judge``).  The root -- the store server, ``Root`` and ``Judge`` -- runs in this process;
all node agents run in one child process and talk to it over localhost, in lock step on a simulated
clock (the agents' work for 10,000 ranks does not fit one interval of this 2-core box; the lock step
uses keys of its own, not counted).  The store and every byte on it are real.

After ``--warmup`` seconds of healthy training one rank (the culprit, on a node other than the root's)
stops outside collectives and shows no sign of life; every other rank then waits in the next all-reduce.
The run ends at the verdict; the root then pulls the suspected nodes' full states (stacks included) through
the control message, and ``diagnose()`` must name the culprit (DDP205 at its line).

A job of one node (8 ranks) is watched in-process, as ``ddp-doctor run`` watches it: no root store.

One JSON line per run: ranks, nodes, interval_s, root_requests_per_node_per_interval (every request the
root store served while watching -- the nodes' posts and control reads, the root's reads -- per node other
than the root's own, per interval), bytes_per_s (value bytes written to and read from the root store),
watcher_cpu_s_per_s (the root process: its decision loop plus the root store server's thread, CPU
seconds per simulated second, ``time.process_time``; split into root_loop_cpu_s_per_s, the loop's
``time.thread_time``, and store_server_cpu_s_per_s, the rest), node_agent_cpu_s_per_s (one node agent's summary + encoding + posting, per node), limit_s,
detect_latency_s (from the stall to the verdict, simulated clock), culprit_ok.

    PYTHONPATH=src python benchmarks/scale.py --ranks 8 --ranks 512 --ranks 10000
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
from ddp_doctor.diagnose.live import Judge  # noqa: E402
from ddp_doctor.diagnose.summary import Summarizer  # noqa: E402
from ddp_doctor.evidence import (Activity, Collective, JobEvidence, NodeDetail, RankState, Site,  # noqa: E402
                                 SiteCount, ThreadStack)
from ddp_doctor.watcher.root import Root, interval_for  # noqa: E402
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
        self.waiting_since: float | None = None
        self.sites = (SiteCount(OPS[0][0], TRAIN, 1), SiteCount(OPS[1][0], STEP, 2), SiteCount(OPS[3][0], LOSS, 1))

    def state(self, now: float, sched: Schedule, stalled_at: int | None) -> RankState:
        sched.upto(self.seq + 2)
        in_coll = None
        where = TRAIN
        if self.stuck:
            where = STUCK
        elif stalled_at is not None:
            self.seq = stalled_at + 1          # entered the collective the culprit never reaches
            if self.waiting_since is None:
                self.waiting_since = now
                self.sig += 1
            f = sched.fps[stalled_at]
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
        return RankState(
            rank=self.rank, local_rank=self.local_rank, host=f"node{self.node}", pid=1000 + self.rank,
            world_size=self.world, epoch=step // STEPS_PER_EPOCH, step=step, step_in_epoch=step % STEPS_PER_EPOCH,
            progress=self.seq + step, steps_by_epoch=(STEPS_PER_EPOCH,) * (step // STEPS_PER_EPOCH),
            step_times=(0.2,) * 50, cpu_s=self.cpu, activity=Activity(self.cpu, 0, 0.0, self.sig),
            pg_timeout_s=1800.0, where=where, in_collective=in_coll, seq={"world": self.seq}, fingerprints=fps,
            site_counts=self.sites, coll_count=self.seq)


class SimNode:
    """A node agent: its ranks' views, its summarizer, its link to the root."""

    def __init__(self, node: int, ranks: list[SimRank], channel: SideChannel | None) -> None:
        self.node = node
        self.ranks = ranks
        self.views = {r.rank: RankView(r.rank) for r in ranks}
        self.summarizer = Summarizer(node=node, digests=True)
        self.uplink = Uplink(channel) if channel is not None else None
        self.first_t: float | None = None
        self.summary = None

    def tick(self, now: float, sched: Schedule, stalled_at: int | None):
        for r in self.ranks:
            self.views[r.rank].update(r.state(now, sched, stalled_at), now)
        self.first_t = self.first_t if self.first_t is not None else now
        self.summary = self.summarizer.summary(self.views, now, first_state_t=self.first_t, host=f"node{self.node}")
        if self.uplink is not None:
            self.uplink.post(self.summary, now)
            ctl = self.uplink.control()
            if ctl is not None:
                pull = self.uplink.pull_for_me(ctl)
                if pull is not None:
                    self.uplink.answer(self.detail(pull.req, now))
        return self.summary

    def detail(self, req: int, now: float) -> NodeDetail:
        """What the agent sends when pulled: every rank's full state with its stack (simulated frames)."""
        out = []
        for r in self.ranks:
            v = self.views[r.rank]
            st = v.state
            frames = (Site("/job/train.py", 90, "<module>"), st.where or TRAIN)
            out.append(st.with_(stack=frames, threads=(ThreadStack("MainThread", True, frames),), busy=v.busy(now),
                                stalled_s=round(now - v.progress_t, 2), idle_s=round(v.idle_s(now), 2),
                                sites_seen=frozenset(v.sites_seen)))
        return NodeDetail(self.node, req, f"node{self.node}", tuple(out))


STEPS_PER_S = 5.0
SYNC = "bench/"          # the benchmark's own lock-step keys (not ddp-doctor traffic; not counted)


def _client(port: int, timeout_s: float = 600.0):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def nodes_process(port: int, secret: str, n_ranks: int, per_node: int, interval: float, warmup: float,
                  culprit_rank: int) -> None:
    """The child: every node agent of the job, ticking on the simulated clock in lock step with the root."""
    os.environ[SECRET_ENV] = secret
    sync = _client(port)
    client = _client(port, 30.0)
    n_nodes = math.ceil(n_ranks / per_node)
    sched = Schedule()
    ranks = [SimRank(r, r % per_node, r // per_node, n_ranks) for r in range(n_ranks)]
    culprit = ranks[culprit_rank]
    nodes = [SimNode(k, ranks[k * per_node:(k + 1) * per_node], SideChannel(client, secret=secret.encode()))
             for k in range(n_nodes)]
    channels = [n.uplink.channel for n in nodes]
    now, stalled_at, k = 0.0, None, 0
    window = None          # (requests, bytes) at the start of the measured window
    node_cpu = 0.0
    while True:
        k += 1
        now = round(now + interval, 6)
        pos = int(now * STEPS_PER_S) * len(OPS)  # the job trains STEPS_PER_S steps a second
        for r in ranks:
            if stalled_at is None and not r.stuck:
                r.seq = pos
        if stalled_at is None and now >= warmup:
            culprit.stuck = True
            stalled_at = culprit.seq
        if window is None and now >= 2.0:  # from the first summaries on (registration done)
            window = (sum(c.stats.requests for c in channels),
                      sum(c.stats.bytes_in + c.stats.bytes_out for c in channels))
        c0 = time.thread_time()
        for n in nodes:
            n.tick(now, sched, stalled_at)
        if window is not None:
            node_cpu += time.thread_time() - c0
        sync.set(f"{SYNC}tick/{k}", json.dumps([now]))
        sync.wait([f"{SYNC}go/{k}"])
        if sync.get(f"{SYNC}go/{k}") != b"on":
            break
    stats = {"requests": sum(c.stats.requests for c in channels) - window[0],
             "bytes": sum(c.stats.bytes_in + c.stats.bytes_out for c in channels) - window[1],
             "node_cpu": node_cpu}
    sync.set(f"{SYNC}stats", json.dumps(stats))
    # the pull: every node reads the control message (as on its next intervals) and answers what it is asked
    while not sync.check([f"{SYNC}stop"]):
        now = round(now + interval, 6)
        for n in nodes:
            ctl = n.uplink.control()
            pull = n.uplink.pull_for_me(ctl) if ctl is not None else None
            if pull is not None:
                n.uplink.answer(n.detail(pull.req, now))
        time.sleep(0.05)


def warmup_tick(now: float, warmup: float, interval: float) -> float:
    """The simulated time of the first tick at or after the warm-up: the stall."""
    return round(math.ceil(warmup / interval - 1e-9) * interval, 6)


def state_parse_s() -> tuple[int, float]:
    """(bytes, seconds) of parsing one rank's full posted state, as a node agent reads it from its store (a
    ring of 256 fingerprints, 50 step times): the part of the agent's work the simulation does not do."""
    from ddp_doctor.evidence import rank_state_from_wire, to_wire

    sched = Schedule()
    r = SimRank(3, 3, 0, 8)
    r.seq = 4000
    raw = to_wire(r.state(10.0, sched, None).with_(step_times=tuple(0.2 + i * 1e-4 for i in range(200))))
    n = 200
    t = time.thread_time()
    for _ in range(n):
        rank_state_from_wire(raw)
    return len(raw), (time.thread_time() - t) / n


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
        c0 = time.thread_time()
        s = node.tick(now, sched, stalled_at)
        verdict = judge.decide_job(JobView(n_ranks, [(s, 0.0)]), now)
        if now >= 2.0:
            t0 = now if t0 is None else t0
            cpu += time.thread_time() - c0
    culprit_ok = False
    if verdict is not None:
        ev = JobEvidence(n_ranks, {st.rank: st for st in node.detail(0, now).ranks}, now, limit, "--hang-timeout")
        _, findings = diagnose(ev, verdict)
        culprit_ok = bool(findings) and findings[0].code == "DDP205" and findings[0].ranks == [culprit.rank]
    watched = now - t0
    return {"ranks": n_ranks, "nodes": 1, "interval_s": interval, "root_requests_per_node_per_interval": 0.0,
            "bytes_per_s": 0, "watcher_cpu_s_per_s": round(cpu / watched, 4), "root_loop_cpu_s_per_s": round(cpu / watched, 4),
            "store_server_cpu_s_per_s": 0.0, "node_agent_cpu_s_per_s": round(cpu / watched, 4), "limit_s": limit,
            "detect_latency_s": None if verdict is None else round(now - warmup_tick(0.0, warmup, interval), 2),
            "verdict": None if verdict is None else verdict.reason, "culprit": culprit.rank, "culprit_ok": culprit_ok,
            "pulled_nodes": 0}


def run(n_ranks: int, per_node: int, interval: float | None, limit: float, warmup: float) -> dict:
    import multiprocessing as mp

    import torch.distributed as dist

    n_nodes = math.ceil(n_ranks / per_node)
    interval = interval or interval_for(n_nodes)
    if n_nodes == 1:
        return run_one_node(n_ranks, interval, limit, warmup)
    secret = os.environ.get(SECRET_ENV) or new_secret()
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30))
    port = server.port
    root_channel = SideChannel(server, secret=secret.encode())
    reader = SideChannel(_client(port, 1.0), secret=secret.encode())
    sync = _client(port)
    culprit = (n_nodes // 2) * per_node + per_node - 1 if n_nodes > 1 else n_ranks - 1
    child = mp.get_context("spawn").Process(target=nodes_process, daemon=True,
                                            args=(port, secret, n_ranks, per_node, interval, warmup, culprit))
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
    # the diagnosis: the suspected nodes' full states and stacks, the other ranks from their summaries
    culprit_ok, pulled = False, set()
    if verdict is not None:
        pulled = root.suspected(verdict, job)
        root.request(pulled, stacks=True)
        root.wait(pulled, 60.0)
        states = root.light_states()
        for v in root.remote_views(now).values():
            states[v.rank] = v.state.with_(stack=v.stack, threads=v.threads, sites_seen=frozenset(v.sites_seen))
        ev = JobEvidence(n_ranks, dict(sorted(states.items())), now, limit, "--hang-timeout")
        _, findings = diagnose(ev, verdict)
        culprit_ok = bool(findings) and findings[0].code == "DDP205" and findings[0].ranks == [culprit] \
            and findings[0].location is not None and findings[0].location.line == STUCK.line
    sync.set(f"{SYNC}stop", b"1")
    child.join(30)
    watched_s = t_verdict - t0
    ticks = max(1, round(watched_s / interval))
    requests = root_requests + nodes_stats["requests"]
    return {
        "ranks": n_ranks, "nodes": n_nodes, "interval_s": interval,
        "root_requests_per_node_per_interval": round(requests / n_nodes / ticks, 3),
        "bytes_per_s": round((root_bytes + nodes_stats["bytes"]) / watched_s),
        "watcher_cpu_s_per_s": round(process_cpu / watched_s, 4),
        "root_loop_cpu_s_per_s": round(root_cpu / watched_s, 4),
        "store_server_cpu_s_per_s": round((process_cpu - main_cpu) / watched_s, 4),
        "node_agent_cpu_s_per_s": round(nodes_stats["node_cpu"] / n_nodes / watched_s, 4),
        "limit_s": limit, "detect_latency_s": None if verdict is None else round(t_verdict - t_stall, 2),
        "verdict": None if verdict is None else verdict.reason, "culprit": culprit, "culprit_ok": culprit_ok,
        "pulled_nodes": len(pulled),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", type=int, action="append", help="simulated ranks (repeat for several runs)")
    ap.add_argument("--ranks-per-node", type=int, default=8)
    ap.add_argument("--interval", type=float, default=None,
                    help="seconds between summaries (default: ddp-doctor's own for the number of nodes)")
    ap.add_argument("--limit", type=float, default=10.0, help="the hang limit (--hang-timeout, s)")
    ap.add_argument("--warmup", type=float, default=5.0, help="healthy training before the stall (s)")
    a = ap.parse_args(argv)
    size, parse = state_parse_s()
    for n in a.ranks or [8]:
        r = run(n, a.ranks_per_node, a.interval, a.limit, a.warmup)
        # what the simulation leaves out on each node: parsing its ranks' JSON states every poll
        r["rank_state_bytes"] = size
        r["node_state_parse_cpu_s_per_s"] = round(min(n, a.ranks_per_node) * parse / r["interval_s"], 4)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
