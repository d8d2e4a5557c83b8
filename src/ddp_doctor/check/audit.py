"""The per-node environment audit of ``check``: facts are measured, then judged by pure rules.

:func:`measure_node` reads the machine (``/dev/shm``, rlimits, CPUs, GPUs); :func:`audit_node`
turns facts + the user's environment + the job shape into a list of checks, each with a
status and — when not ok — the finding code (DDP504-DDP507, DDP509) that explains it.
Both are plain functions so the rules are unit-tested without a launcher.
"""
from __future__ import annotations

import os
import socket
from typing import Any, Mapping

#: Environment variables the audit looks at (the launcher passes the user's values to ranks).
ENV_PREFIXES = ("NCCL_", "TORCH_NCCL_", "TORCH_DISTRIBUTED", "GLOO_", "CUDA_", "OMP_", "MKL_",
                "OPENBLAS_", "TORCH_CPP_LOG_LEVEL", "PYTORCH_")

#: deprecated name -> the name torch reads now
DEPRECATED = {
    "NCCL_BLOCKING_WAIT": "TORCH_NCCL_BLOCKING_WAIT",
    "NCCL_ASYNC_ERROR_HANDLING": "TORCH_NCCL_ASYNC_ERROR_HANDLING",
    "NCCL_DESYNC_DEBUG": "TORCH_NCCL_DESYNC_DEBUG",
    "NCCL_ENABLE_TIMING": "TORCH_NCCL_ENABLE_TIMING",
}

#: slow-path switches: variable -> why it hurts
SLOW_PATH = {
    "NCCL_P2P_DISABLE": "GPU peer-to-peer (NVLink/PCIe) is disabled: intra-node traffic goes through host memory",
    "NCCL_SHM_DISABLE": "NCCL's shared-memory transport is disabled",
    "NCCL_IB_DISABLE": "InfiniBand/RoCE is disabled: inter-node traffic falls back to TCP sockets",
}

PREFETCH_FACTOR = 2  # DataLoader's default


def user_env(environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """The variables of ``environ`` (default: os.environ) the audit cares about."""
    environ = os.environ if environ is None else environ
    return {k: v for k, v in environ.items() if k.startswith(ENV_PREFIXES)}


def measure_node(shm_path: str = "/dev/shm") -> dict[str, Any]:
    """Facts of this machine: shm size/free bytes, rlimits, usable CPUs, GPU count."""
    import resource

    facts: dict[str, Any] = {}
    try:
        st = os.statvfs(shm_path)
        facts["shm_total"] = st.f_blocks * st.f_frsize
        facts["shm_free"] = st.f_bavail * st.f_frsize
    except OSError:
        facts["shm_total"] = facts["shm_free"] = None
    for name, key in (("RLIMIT_NOFILE", "nofile"), ("RLIMIT_NPROC", "nproc")):
        soft, hard = resource.getrlimit(getattr(resource, name))
        facts[key] = [None if soft == resource.RLIM_INFINITY else soft,
                      None if hard == resource.RLIM_INFINITY else hard]
    try:
        facts["cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        facts["cpus"] = os.cpu_count() or 1
    return facts


def _check(name: str, status: str, value: str, detail: str = "", code: str | None = None,
           severity: str | None = None, fix: str = "") -> dict[str, Any]:
    return {"check": name, "status": status, "value": value, "detail": detail,
            "code": code, "severity": severity, "fix": fix}


def _cpu_fix(cpus: int, local_ranks: int) -> str:
    per_rank = cpus // max(1, local_ranks) - 1
    if per_rank >= 1:
        return f"num_workers <= {per_rank} per rank (or more CPUs)"
    return f"{cpus} CPUs cannot feed {local_ranks} ranks: fewer ranks per node or more CPUs; num_workers 0-1"


def _int_env(env: Mapping[str, str], name: str) -> int | None:
    try:
        return int(env[name])
    except (KeyError, ValueError):
        return None


def _mib(n: int | None) -> str:
    return "?" if n is None else f"{n / 1024 ** 2:,.0f} MiB"


def audit_node(facts: Mapping[str, Any], env: Mapping[str, str], *, local_ranks: int, nnodes: int = 1,
               workers: int = 4, batch_bytes: int = 32 * 1024 ** 2, gpus: int | None = None) -> list[dict[str, Any]]:
    """Judge one node.  ``gpus`` is the number of visible GPUs (None: CPU-only run).

    Returns checks ``{"check", "status": ok|warn|fail|info, "value", "detail", "code",
    "severity", "fix"}``; ``code`` is set when the check is not ok.
    """
    checks: list[dict[str, Any]] = []
    workers = max(0, workers)

    # /dev/shm vs DataLoader workers: every worker holds up to prefetch_factor batches in shm.
    need = local_ranks * workers * PREFETCH_FACTOR * batch_bytes
    free, total = facts.get("shm_free"), facts.get("shm_total")
    if free is None:
        checks.append(_check("/dev/shm", "warn", "missing", "no /dev/shm: DataLoader workers cannot share batches",
                             "DDP504", fix="mount a tmpfs at /dev/shm (docker: --shm-size=16g or --ipc=host)"))
    elif workers and free < need:
        checks.append(_check(
            "/dev/shm", "fail", f"{_mib(free)} free",
            f"DataLoader workers need about {_mib(need)} ({local_ranks} ranks x {workers} workers x "
            f"prefetch {PREFETCH_FACTOR} x {_mib(batch_bytes)} batches); they will die with 'Bus error'",
            "DDP504", fix="docker run --shm-size=16g (or --ipc=host), or fewer workers / smaller prefetch_factor"))
    else:
        checks.append(_check("/dev/shm", "ok", f"{_mib(free)} free", f"of {_mib(total)}; workers need ~{_mib(need)}"))

    # open files / processes
    procs = local_ranks * (1 + workers)
    nofile_soft = (facts.get("nofile") or [None])[0]
    need_files = max(4096, procs * 256)
    if nofile_soft is not None and nofile_soft < need_files:
        checks.append(_check("ulimit -n (open files)", "warn", str(nofile_soft),
                             f"{procs} processes (ranks + workers) want ~{need_files}: 'Too many open files' later",
                             "DDP505", fix=f"ulimit -n {max(65536, need_files)} (docker: --ulimit nofile=65536:65536)"))
    else:
        checks.append(_check("ulimit -n (open files)", "ok", "unlimited" if nofile_soft is None else str(nofile_soft)))
    nproc_soft = (facts.get("nproc") or [None])[0]
    need_threads = procs * 64
    if nproc_soft is not None and nproc_soft < need_threads:
        checks.append(_check("ulimit -u (processes)", "warn", str(nproc_soft),
                             f"{procs} processes with ~64 threads each: 'can't start new thread' later",
                             "DDP505", fix="ulimit -u unlimited (or raise nproc in /etc/security/limits.conf)"))
    else:
        checks.append(_check("ulimit -u (processes)", "ok", "unlimited" if nproc_soft is None else str(nproc_soft)))

    # CPUs vs ranks x (1 + workers), and intra-op threads
    cpus = int(facts.get("cpus") or 1)
    if procs > cpus:
        checks.append(_check("CPUs", "warn", f"{cpus} for {procs} processes",
                             f"{local_ranks} ranks x (1 + {workers} DataLoader workers) > {cpus} CPUs: loading and ranks compete",
                             "DDP506", fix=_cpu_fix(cpus, local_ranks)))
    else:
        checks.append(_check("CPUs", "ok", f"{cpus} for {procs} processes", f"{local_ranks} ranks x (1 + {workers} workers)"))
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        n = _int_env(env, var)
        if n is None:
            checks.append(_check(var, "ok", "unset", "torchrun sets 1" if var == "OMP_NUM_THREADS" and local_ranks > 1 else ""))
        elif n * local_ranks > cpus:
            checks.append(_check(var, "warn", str(n), f"{local_ranks} ranks x {n} threads > {cpus} CPUs",
                                 "DDP506", fix=f"{var}={max(1, cpus // max(1, local_ranks))}"))
        else:
            checks.append(_check(var, "ok", str(n)))

    # deprecated / contradictory / slow-path variables
    for old, new in DEPRECATED.items():
        if old not in env:
            continue
        if new in env and env[new] != env[old]:
            checks.append(_check(old, "fail", f"{old}={env[old]} {new}={env[new]}",
                                 f"contradictory: {old} (deprecated) and {new} disagree; "
                                 "which one wins depends on the torch version",
                                 "DDP507", severity="error", fix=f"unset {old}; keep only {new}"))
        else:
            checks.append(_check(old, "warn", env[old], f"deprecated: torch reads {new}",
                                 "DDP507", fix=f"export {new}={env[old]}; unset {old}"))
    for var, why in SLOW_PATH.items():
        if env.get(var, "0") not in ("", "0"):
            if var == "NCCL_IB_DISABLE" and nnodes <= 1:
                continue
            checks.append(_check(var, "warn", env[var], why, "DDP507",
                                 fix=f"unset {var} unless `ddp-doctor check` fails without it"))
    if env.get("TORCH_NCCL_BLOCKING_WAIT", env.get("NCCL_BLOCKING_WAIT", "0")) not in ("", "0"):
        checks.append(_check("TORCH_NCCL_BLOCKING_WAIT", "info", "1",
                             "blocking wait: every collective is waited on by the CPU (slower; hides async error handling)"))

    # devices: CUDA_VISIBLE_DEVICES vs ranks per node
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None and gpus is not None:
        ids = [x.strip() for x in cvd.split(",") if x.strip()]
        if len(set(ids)) != len(ids):
            checks.append(_check("CUDA_VISIBLE_DEVICES", "fail", cvd, "lists a device twice: two ranks share a GPU",
                                 "DDP509", fix="list each GPU once"))
        elif len(ids) < local_ranks:
            checks.append(_check("CUDA_VISIBLE_DEVICES", "fail", cvd,
                                 f"{len(ids)} devices for {local_ranks} ranks on this node: ranks share a GPU",
                                 "DDP509", fix=f"--nproc-per-node {len(ids)}, or list {local_ranks} GPUs"))
        else:
            checks.append(_check("CUDA_VISIBLE_DEVICES", "ok", cvd))
    if gpus is not None:
        if gpus < local_ranks:
            checks.append(_check("GPUs vs ranks", "fail", f"{gpus} GPUs, {local_ranks} ranks",
                                 "more ranks than visible GPUs on this node", "DDP509",
                                 fix=f"--nproc-per-node {gpus}"))
        else:
            checks.append(_check("GPUs vs ranks", "ok", f"{gpus} GPUs, {local_ranks} ranks"))
    elif cvd is not None:
        checks.append(_check("CUDA_VISIBLE_DEVICES", "info", cvd, "set, but CUDA is not available to torch here"))
    return checks


def version_groups(hellos: list[Mapping[str, Any]],
                   keys=("python", "torch", "cuda", "nccl")) -> dict[str, dict[str, list[int]]]:
    """For each version key whose value differs across ranks: value -> ranks."""
    out: dict[str, dict[str, list[int]]] = {}
    for key in keys:
        groups: dict[str, list[int]] = {}
        for h in hellos:
            groups.setdefault(str(h.get(key)), []).append(int(h["rank"]))
        if len(groups) > 1:
            out[key] = {value: sorted(ranks) for value, ranks in groups.items()}
    return out


def rank_device(local_rank: int, backend: str | None):
    """This rank's device and backend: its own GPU (set as current) with NCCL, else the CPU with gloo."""
    import torch

    if backend != "gloo" and torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank), backend or "nccl"
    return torch.device("cpu"), backend or "gloo"


def rank_identity(rank: int, local_rank: int, device, backend: str) -> dict[str, Any]:
    """What this rank runs on (host, device, versions): compared across ranks for DDP508 / DDP509."""
    import platform

    import torch

    info: dict[str, Any] = {
        "rank": rank, "local_rank": local_rank, "group_rank": int(os.environ.get("GROUP_RANK", 0)),
        "host": socket.gethostname(), "pid": os.getpid(), "backend": backend, "device": str(device),
        "device_name": "cpu", "python": platform.python_version(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "nccl": None,
    }
    if device.type == "cuda":
        info["device_name"] = torch.cuda.get_device_name(device)
        try:
            info["device_uuid"] = str(torch.cuda.get_device_properties(device).uuid)
        except Exception:  # noqa: BLE001 - older torch
            info["device_uuid"] = None
        try:
            info["nccl"] = ".".join(str(x) for x in torch.cuda.nccl.version())
        except Exception:  # noqa: BLE001
            pass
    return info
