"""The tree of watchers with real processes: six node agents (``benchmarks/scale.py agent``, 4 simulated ranks
each) in two groups of three, each agent hosting its group store; the root (this test: the root store,
``Root``, ``Judge``) on the wall clock.  Group 1's leader is killed (SIGKILL) mid-run: its two other nodes must
move to the group's next node, the root must keep their ranks and declare only the dead node's ranks lost,
stop nothing while the rest is healthy, and then, when a rank of the last node stops outside collectives,
decide ``hang`` and name it at its line from the full states pulled down the tree through the new leader."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddp_doctor import store as side
from ddp_doctor.channel import SECRET_ENV, SideChannel, new_secret
from ddp_doctor.diagnose import diagnose
from ddp_doctor.diagnose.live import Judge
from ddp_doctor.evidence import JobEvidence

pytestmark = [pytest.mark.scenario, pytest.mark.timing]
ROOT = Path(__file__).resolve().parents[2]
NODES, PER, GROUP = 6, 4, 3
KILL_AT, STALL_AT, LIMIT, LOST_S = 1.5, 5.0, 3.0, 5.0
STUCK_LINE = 88   # benchmarks/scale.py STUCK


def test_a_killed_group_leader_keeps_its_group_watched_and_the_verdict_right(tmp_path):
    import torch.distributed as dist
    from datetime import timedelta

    from ddp_doctor.watcher.root import Root

    secret = new_secret()
    os.environ[SECRET_ENV] = secret
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=10))
    channel = SideChannel(server, secret=secret.encode())
    culprit = NODES * PER - 1                 # the last rank of node 5 (group 1; node 3 leads it)
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), **{SECRET_ENV: secret})
    agents = [subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "scale.py"), "agent", "--node", str(k),
                                "--nodes", str(NODES), "--ranks-per-node", str(PER), "--group-size", str(GROUP),
                                "--root", f"127.0.0.1:{server.port}", "--culprit", str(culprit),
                                "--stall-at", str(STALL_AT)], env=env, stdout=subprocess.DEVNULL,
                               stderr=open(tmp_path / f"agent{k}.err", "w"), start_new_session=True)
              for k in range(NODES)]
    try:
        end = time.monotonic() + 60
        while channel.add("bench/ready", 0) < NODES:
            assert time.monotonic() < end and all(p.poll() is None for p in agents), \
                [(tmp_path / f"agent{k}.err").read_text()[-800:] for k in range(NODES)]
            time.sleep(0.1)
        start = time.time() + 0.3
        channel.set("bench/start", repr(start))
        root = Root(channel, side.reader_channel(server.port), NODES * PER, slot=-1)
        root.lost_s = LOST_S          # (the default is 15 s: shorter here, to keep the test short)
        judge = Judge(LIMIT)
        verdict, killed, job = None, False, None
        while verdict is None and time.time() - start < STALL_AT + LIMIT + LOST_S + 8:
            t = time.time() - start
            if not killed and t >= KILL_AT:
                os.killpg(agents[3].pid, signal.SIGKILL)   # group 1's leader
                killed = True
            now = time.monotonic()
            root.read(now)
            root.confirm({}, now)
            job = root.job_view(None, now)
            verdict = judge.decide_job(job, now)
            time.sleep(0.2)
        t_verdict = time.time() - start
        assert verdict is not None and verdict.reason == "stalled", (verdict, t_verdict)  # a diagnosis at the limit, no kill
        assert t_verdict >= STALL_AT + LIMIT, t_verdict   # nothing stopped the healthy job before (the kill neither)
        lost = sorted(r for x in job.lost for r in x.ranks)
        assert lost == list(range(3 * PER, 4 * PER)), (lost, [(k, sl.summary and sl.summary.ranks, round(time.monotonic() - sl.t, 1)) for k, sl in root.slots.items()], [(tmp_path / f"agent{k}.err").read_text()[-600:] for k in range(NODES)])  # only the dead leader's own node
        assert job.seen == NODES * PER, job.seen              # every other rank still watched, none twice
        pulled = root.suspected(verdict, job)
        root.request(pulled, stacks=True, ranks=root.suspected_ranks(verdict, job))
        missing = root.wait(pulled, 10.0)
        assert not missing, missing
        states = root.light_states()
        for v in root.remote_views(time.monotonic()).values():
            states[v.rank] = v.state.with_(stack=v.stack, threads=v.threads, sites_seen=frozenset(v.sites_seen))
        assert culprit in {v.rank for v in root.remote_views(time.monotonic()).values()}
        _, findings = diagnose(JobEvidence(NODES * PER, dict(sorted(states.items())), t_verdict, LIMIT,
                                           "--hang-timeout"), verdict)
        f = findings[0]
        assert f.code == "DDP205" and f.ranks == [culprit] and f.location.line == STUCK_LINE, findings
    finally:
        channel.set("bench/stop", "1")
        for p in agents:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
