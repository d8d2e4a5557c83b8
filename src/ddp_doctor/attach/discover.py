"""Find a distributed training job's processes on this node: ranks, their launcher, their DataLoader workers.

A rank is a process whose environment (``/proc/PID/environ``) has ``RANK`` and ``WORLD_SIZE`` — what
torchrun, ``python -m torch.distributed.run``, accelerate, Lightning and srun-style starts all set.
A child of a rank with the same ``RANK`` is one of its DataLoader workers (they inherit the
environment).  A job is told apart from another by its rendezvous (run id, master address and port).
"""
from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field

from ddp_doctor.attach.pyspy import PTRACE_HELP, AttachError


@dataclass
class RankProcess:
    """One rank of the job on this node, with its DataLoader worker PIDs."""

    pid: int
    rank: int
    local_rank: int | None
    world_size: int
    local_world_size: int | None
    job: str
    cmdline: list[str]
    workers: list[int] = field(default_factory=list)
    status: str = "running"  # psutil status: running, sleeping, zombie, ...


@dataclass
class DiscoveredJob:
    """The ranks found on this node and the launcher process that started them (if any)."""

    job: str
    world_size: int
    ranks: list[RankProcess]
    agent_pid: int | None = None
    node: str = ""

    @property
    def whole_job_here(self) -> bool:
        """Every rank of the job runs on this node (so a missing one is gone, not elsewhere)."""
        lws = {r.local_world_size for r in self.ranks}
        return lws == {self.world_size} or (None in lws and len(self.ranks) == self.world_size)


def _int(env: dict, key: str) -> int | None:
    try:
        return int(env[key])
    except (KeyError, ValueError):
        return None


def _env(proc) -> dict | None:
    import psutil

    try:
        return proc.environ()
    except psutil.AccessDenied:
        raise AttachError(f"cannot read the environment of process {proc.pid}: {PTRACE_HELP}") from None
    except (psutil.NoSuchProcess, psutil.ZombieProcess, OSError):
        return None


def _job_key(env: dict) -> str:
    run_id = env.get("TORCHELASTIC_RUN_ID")
    addr = f"{env.get('MASTER_ADDR', '?')}:{env.get('MASTER_PORT', '?')}"
    return f"{run_id} ({addr})" if run_id and run_id != "none" else addr


def _is_rank_env(env: dict | None) -> bool:
    """RANK and WORLD_SIZE (torchrun, srun-style, accelerate), or Lightning's LOCAL_RANK + NODE_RANK + WORLD_SIZE."""
    if not env or _int(env, "WORLD_SIZE") is None:
        return False
    return _int(env, "RANK") is not None or (_int(env, "LOCAL_RANK") is not None and "NODE_RANK" in env)


def _rank_of(env: dict, local_per_node: int) -> int:
    r = _int(env, "RANK")
    if r is not None:
        return r
    return (_int(env, "NODE_RANK") or 0) * local_per_node + (_int(env, "LOCAL_RANK") or 0)


def _candidates(pids: list[int] | None, mine: set[int]) -> list:
    import psutil

    if not pids:
        return [p for p in psutil.process_iter() if p.pid not in mine]
    out = []
    for pid in pids:
        try:
            p = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise AttachError(f"no process with PID {pid}") from None
        out.append(p)
        try:
            out += p.children(recursive=True)
            out += p.parents()[:3]
        except psutil.Error:
            pass
    return out


def _is_python(p) -> bool:
    import psutil

    try:
        return "python" in p.name().lower() or "python" in " ".join(p.cmdline()[:1]).lower()
    except psutil.Error:
        return False


def find_jobs(pids: list[int] | None = None) -> list[DiscoveredJob]:
    """Distributed jobs on this node; only those containing ``pids`` (a rank, a worker or the launcher) if given."""
    import psutil

    me = os.getpid()
    mine = {me} | {p.pid for p in psutil.Process(me).children(recursive=True)}
    envs: dict[int, dict] = {}
    info: dict[int, tuple[int, list[str], str]] = {}  # pid -> (ppid, cmdline, status)
    for p in _candidates(pids, mine):
        if p.pid in envs or p.pid in mine or (not pids and not _is_python(p)):
            continue
        try:
            env = _env(p)
        except AttachError:
            if pids and p.pid in pids:
                raise
            continue  # another user's process: not ours to read
        if not _is_rank_env(env):
            continue
        try:
            info[p.pid] = (p.ppid(), p.cmdline(), p.status())
        except psutil.Error:
            continue
        envs[p.pid] = env
    # Lightning's own launcher: the process the user started becomes local rank 0 and sets its rank variables
    # in os.environ only (not visible in /proc/PID/environ); its children carry LOCAL_RANK >= 1.
    implicit: dict[int, dict] = {}
    for pid, env in envs.items():
        ppid = info[pid][0]
        if "RANK" not in env and (_int(env, "LOCAL_RANK") or 0) > 0 and ppid not in envs:
            implicit.setdefault(ppid, dict(env, LOCAL_RANK="0"))
    for ppid, env in implicit.items():
        try:
            pp = psutil.Process(ppid)
            info[ppid] = (pp.ppid(), pp.cmdline(), pp.status())
        except psutil.Error:
            continue
        envs[ppid] = env
    local_n = Counter((e.get("NODE_RANK"), e.get("MASTER_PORT")) for e in envs.values())
    ranks: dict[int, tuple[RankProcess, int]] = {}
    workers: dict[int, int] = {}  # worker pid -> rank pid
    for pid, env in envs.items():
        ppid, cmd, status = info[pid]
        parent_env = envs.get(ppid)
        # a child of a rank with the same rank variables is that rank's DataLoader worker (inherited environment)
        if parent_env is not None and (parent_env.get("RANK"), parent_env.get("LOCAL_RANK")) == \
                (env.get("RANK"), env.get("LOCAL_RANK")):
            workers[pid] = ppid
            continue
        n_local = _int(env, "LOCAL_WORLD_SIZE") or local_n[(env.get("NODE_RANK"), env.get("MASTER_PORT"))]
        rp = RankProcess(pid, _rank_of(env, n_local), _int(env, "LOCAL_RANK"), int(env["WORLD_SIZE"]),
                         _int(env, "LOCAL_WORLD_SIZE"), _job_key(env), cmd, status=status)
        ranks[pid] = (rp, ppid)
    for w, owner in workers.items():
        while owner in workers:
            owner = workers[owner]
        if owner in ranks:
            ranks[owner][0].workers.append(w)
    jobs: dict[str, DiscoveredJob] = {}
    for rp, ppid in ranks.values():
        job = jobs.setdefault(rp.job, DiscoveredJob(rp.job, rp.world_size, []))
        job.ranks.append(rp)
    for job in jobs.values():
        job.ranks.sort(key=lambda r: r.rank)
        parents = {ranks[r.pid][1] for r in job.ranks}
        # the launcher only when torch's elastic agent started the ranks (never a shell, srun or a test runner:
        # `--stop` signals it)
        elastic = all("TORCHELASTIC_RUN_ID" in envs[r.pid] for r in job.ranks)
        job.agent_pid = next(iter(parents)) if elastic and len(parents) == 1 and not (parents & set(ranks)) else None
        job.node = os.uname().nodename
    return sorted(jobs.values(), key=lambda j: -len(j.ranks))


def find_job(pids: list[int] | None = None) -> DiscoveredJob:
    """The one job to attach to; AttachError (with what to do) when there is none or several."""
    jobs = find_jobs(pids)
    if not jobs:
        where = f"among PIDs {', '.join(map(str, pids))} and their children" if pids else "on this node"
        raise AttachError(f"no training process found {where}: looked for Python processes with RANK and "
                          "WORLD_SIZE in their environment (started by torchrun, torch.distributed.run, "
                          "accelerate, Lightning or srun). Pass the PID of a rank or of its launcher.")
    if len(jobs) > 1:
        listing = "; ".join(f"{j.job}: PIDs {', '.join(str(r.pid) for r in j.ranks)}" for j in jobs)
        raise AttachError(f"{len(jobs)} distributed jobs run on this node ({listing}); pass the PID of one of "
                          "their ranks or of its launcher")
    return jobs[0]
