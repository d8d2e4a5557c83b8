"""Find a distributed training job's processes on this node: ranks, their launcher, their DataLoader workers.

A rank is a process whose environment (``/proc/PID/environ``) has ``RANK`` and ``WORLD_SIZE`` — what
torchrun, ``python -m torch.distributed.run``, accelerate, Lightning and srun-style starts all set.
A child of a rank with the same ``RANK`` is one of its DataLoader workers (they inherit the
environment).  A job is told apart from another by its rendezvous (run id, master address and port).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

from ddp_doctor.attach.stacks import PTRACE_HELP, AttachError


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
class Job:
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
    return bool(env) and _int(env, "RANK") is not None and _int(env, "WORLD_SIZE") is not None


def find_jobs(pids: list[int] | None = None) -> list[Job]:
    """Distributed jobs on this node; only those containing ``pids`` (a rank, a worker or the launcher) if given."""
    import psutil

    me = os.getpid()
    mine = {me} | {p.pid for p in psutil.Process(me).children(recursive=True)}
    ranks: dict[int, tuple[RankProcess, int]] = {}  # pid -> (rank process, parent pid)
    candidates: list = []
    if pids:
        for pid in pids:
            try:
                p = psutil.Process(pid)
            except psutil.NoSuchProcess:
                raise AttachError(f"no process with PID {pid}") from None
            candidates.append(p)
            try:
                candidates += p.children(recursive=True)
                candidates += p.parents()[:3]
            except psutil.Error:
                pass
    else:
        candidates = [p for p in psutil.process_iter() if p.pid not in mine]
    seen = set()
    envs: dict[int, dict] = {}
    for p in candidates:
        if p.pid in seen or p.pid in mine:
            continue
        seen.add(p.pid)
        try:
            name = p.name()
        except psutil.Error:
            continue
        if "python" not in name.lower() and not pids:
            try:
                if "python" not in " ".join(p.cmdline()[:1]).lower():
                    continue
            except psutil.Error:
                continue
        try:
            env = _env(p)
        except AttachError:
            if pids and p.pid in pids:
                raise
            continue  # another user's process: not ours to read
        if not _is_rank_env(env):
            continue
        envs[p.pid] = env
    # a process whose parent is a rank with the same RANK is that rank's worker (DataLoader, a spawned helper)
    for pid, env in envs.items():
        try:
            p = psutil.Process(pid)
            ppid, cmd, status = p.ppid(), p.cmdline(), p.status()
        except psutil.Error:
            continue
        parent_env = envs.get(ppid)
        if parent_env is not None and parent_env.get("RANK") == env.get("RANK"):
            continue
        rp = RankProcess(pid, int(env["RANK"]), _int(env, "LOCAL_RANK"), int(env["WORLD_SIZE"]),
                         _int(env, "LOCAL_WORLD_SIZE"), _job_key(env), cmd, status=status)
        ranks[pid] = (rp, ppid)
    for pid, env in envs.items():
        try:
            ppid = psutil.Process(pid).ppid()
        except psutil.Error:
            continue
        if pid not in ranks and ppid in ranks:
            ranks[ppid][0].workers.append(pid)
    jobs: dict[str, Job] = {}
    for rp, ppid in ranks.values():
        job = jobs.setdefault(rp.job, Job(rp.job, rp.world_size, []))
        job.ranks.append(rp)
        parents = {pp for r, pp in ranks.values() if r.job == rp.job}
        job.agent_pid = next(iter(parents)) if len(parents) == 1 else None
    for job in jobs.values():
        job.ranks.sort(key=lambda r: r.rank)
        job.node = os.uname().nodename
    return sorted(jobs.values(), key=lambda j: -len(j.ranks))


def find_job(pids: list[int] | None = None) -> Job:
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
