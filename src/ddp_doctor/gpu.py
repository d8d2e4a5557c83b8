"""GPU memory per process through NVML (nvidia-ml-py), and which rank holds memory on another rank's GPU.

Three parts:

- :func:`snapshot` reads NVML: every device (index, UUID, memory) and every
  process with a context on it (pid, used memory).  Works without torch.
- :func:`foreign_contexts` matches those processes to ranks and returns the
  ranks that hold memory / a CUDA context on a GPU that is not their own
  (seed 002: every rank's checkpoint landing on GPU 0).
- :func:`sample_utilization` reads NVML's GPU utilisation over time (seed 004:
  a data-starved GPU idling while the loader works).

Matching PIDs robustly: NVML reports PIDs of the *host* PID namespace; inside
a container a rank knows only its namespaced PID.  We match (1) directly, (2)
through ``/proc/<pid>/status`` ``NSpid`` (the chain of PIDs of one process in
nested namespaces, readable when we run in an ancestor namespace), (3) failing
both, by memory: a process's own GPU is the one where it uses the most memory,
and the rank whose device that is owns the process.
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Any

MIB = 1024 * 1024


def _nvml():
    import pynvml  # nvidia-ml-py

    return pynvml


def snapshot(nvml=None, host: str | None = None) -> dict[str, Any] | None:
    """NVML's view now, or None when NVML is unavailable (no driver / no GPU / no nvidia-ml-py).

    ``{"host", "devices": [{"index", "uuid", "name", "used_mib", "total_mib"}],
       "processes": [{"gpu": index, "pid": int, "used_mib": int | None}]}``
    """
    try:
        nv = nvml or _nvml()
        nv.nvmlInit()
    except Exception:
        return None
    try:
        devices, procs = [], []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = nv.nvmlDeviceGetMemoryInfo(h)
            uuid = nv.nvmlDeviceGetUUID(h)
            name = nv.nvmlDeviceGetName(h)
            devices.append({"index": i, "uuid": uuid.decode() if isinstance(uuid, bytes) else str(uuid),
                            "name": name.decode() if isinstance(name, bytes) else str(name),
                            "used_mib": int(mem.used // MIB), "total_mib": int(mem.total // MIB)})
            seen = set()
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                fn = getattr(nv, getter, None)
                if fn is None:
                    continue
                try:
                    plist = fn(h)
                except Exception:
                    continue
                for p in plist:
                    if p.pid in seen:
                        continue
                    seen.add(p.pid)
                    used = getattr(p, "usedGpuMemory", None)
                    procs.append({"gpu": i, "pid": int(p.pid),
                                  "used_mib": None if used is None else int(used // MIB)})
        return {"host": host or _hostname(), "devices": devices, "processes": procs}
    except Exception:
        return None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


@dataclass(frozen=True)
class UtilizationSample:
    """NVML's utilisation of every device at one moment: % of its last sample period with a kernel running."""

    t: float  # time.time()
    gpu_pct: tuple[int, ...]  # per device index


def sample_utilization(stop: threading.Event, period_s: float = 0.1, nvml=None) -> list[UtilizationSample] | None:
    """NVML's GPU utilisation of every device every ``period_s`` until ``stop`` is set; None without NVML.

    NVML averages over its own sample period (1/6 s to 1 s, by product), so a GPU that alternates between
    waiting for data and computing shows as values between 0 and 100 rather than as the two extremes."""
    try:
        nv = nvml or _nvml()
        nv.nvmlInit()
    except Exception:
        return None
    out: list[UtilizationSample] = []
    try:
        handles = [nv.nvmlDeviceGetHandleByIndex(i) for i in range(nv.nvmlDeviceGetCount())]
        while True:
            out.append(UtilizationSample(time.time(), tuple(int(nv.nvmlDeviceGetUtilizationRates(h).gpu)
                                                            for h in handles)))
            if stop.wait(period_s):
                return out
    except Exception:
        return out or None
    finally:
        try:
            nv.nvmlShutdown()
        except Exception:
            pass


def _hostname() -> str:
    import socket

    return socket.gethostname()


def foreign_bytes(snap: dict[str, Any] | None) -> int:
    """How much memory the snapshot's processes hold outside their home GPU (to keep the worst snapshot)."""
    if not snap:
        return 0
    by_pid: dict[int, list[dict[str, Any]]] = {}
    for p in snap.get("processes") or []:
        by_pid.setdefault(p["pid"], []).append(p)
    total = 0
    for entries in by_pid.values():
        if len(entries) > 1:
            home = max(entries, key=lambda e: e.get("used_mib") or 0)
            total += sum((e.get("used_mib") or 1) for e in entries if e is not home)
    return total


def nspid_aliases(pid: int, proc_root: str = "/proc") -> list[int]:
    """All PIDs of process ``pid`` in nested PID namespaces (``NSpid`` of /proc/<pid>/status), outermost first."""
    try:
        with open(os.path.join(proc_root, str(pid), "status")) as f:
            for line in f:
                if line.startswith("NSpid:"):
                    return [int(x) for x in line.split()[1:]]
    except (OSError, ValueError):
        pass
    return [pid]


def physical_index(logical: int, visible: str | None, devices: list[dict[str, Any]]) -> int:
    """NVML index of the rank's ``cuda:logical`` given its CUDA_VISIBLE_DEVICES (indices or UUIDs)."""
    if visible:
        items = [v.strip() for v in visible.split(",") if v.strip()]
        if 0 <= logical < len(items):
            v = items[logical]
            if v.isdigit():
                return int(v)
            for d in devices:
                if d.get("uuid") and (d["uuid"] == v or d["uuid"].startswith(v) or v.startswith(d["uuid"])):
                    return d["index"]
    return logical


def own_gpu(st: dict[str, Any], devices: list[dict[str, Any]]) -> int | None:
    """The NVML index of a rank's own device (by UUID if the probe recorded it, else its local rank)."""
    cuda = st.get("cuda") or {}
    uuid = cuda.get("uuid")
    if uuid:
        for d in devices:
            if d.get("uuid") == uuid:
                return d["index"]
    dev = cuda.get("device")
    if dev is None:
        dev = st.get("local_rank")
    if dev is None:
        return None
    return physical_index(int(dev), cuda.get("visible"), devices)


def match_processes(snap: dict[str, Any], ranks: dict[int, dict[str, Any]],
                    proc_root: str = "/proc") -> dict[int, int]:
    """{NVML pid: global rank} for the ranks on the snapshot's host (see the module doc for the 3 ways)."""
    host = snap.get("host")
    local = {r: st for r, st in ranks.items() if host is None or st.get("host") in (None, host)}
    by_pid = {st.get("pid"): r for r, st in local.items() if st.get("pid")}
    nv_pids = sorted({p["pid"] for p in snap.get("processes") or []})
    out: dict[int, int] = {}
    for pid in nv_pids:
        if pid in by_pid:
            out[pid] = by_pid[pid]
            continue
        for alias in nspid_aliases(pid, proc_root):
            if alias in by_pid:
                out[pid] = by_pid[alias]
                break
    # fallback by memory: an unmatched process belongs to the unmatched rank whose GPU holds most of its memory
    devices = snap.get("devices") or []
    free_ranks = {r: own_gpu(st, devices) for r, st in local.items() if r not in out.values()}
    owner_of_gpu: dict[int, list[int]] = {}
    for r, g in free_ranks.items():
        if g is not None:
            owner_of_gpu.setdefault(g, []).append(r)
    for pid in nv_pids:
        if pid in out:
            continue
        entries = [p for p in snap["processes"] if p["pid"] == pid]
        home = max(entries, key=lambda e: e.get("used_mib") or 0)["gpu"]
        cands = [r for r in owner_of_gpu.get(home, []) if r not in out.values()]
        if len(cands) == 1:
            out[pid] = cands[0]
    return out


def foreign_contexts(gpu: dict[str, Any] | list[dict[str, Any]], ranks: dict[int, dict[str, Any]],
                     proc_root: str = "/proc") -> list[dict[str, Any]]:
    """One item per (rank, GPU that is not its own) where NVML shows that rank's process.

    Item: ``{"rank", "pid", "gpu", "own_gpu", "owner_rank", "used_mib", "load", "cuda_init"}`` where ``load``
    is the rank's torch.load whose tensors landed on that GPU (probe record) and ``cuda_init`` the rank's
    first CUDA use (site, device, before_set_device), when recorded.
    """
    snaps = gpu if isinstance(gpu, list) else [gpu]
    out = []
    for snap in snaps:
        if not snap:
            continue
        devices = snap.get("devices") or []
        pid_rank = match_processes(snap, ranks, proc_root)
        owners = {}
        for r, st in ranks.items():
            if snap.get("host") is None or st.get("host") in (None, snap.get("host")):
                g = own_gpu(st, devices)
                if g is not None:
                    owners.setdefault(g, r)
        for p in snap.get("processes") or []:
            r = pid_rank.get(p["pid"])
            if r is None:
                continue
            st = ranks[r]
            mine = own_gpu(st, devices)
            if mine is None or p["gpu"] == mine:
                continue
            cuda = st.get("cuda") or {}
            visible = cuda.get("visible")
            load = None
            for ld in st.get("loads") or []:
                devs = ld.get("devices") or []
                phys = {physical_index(int(d.split(":")[1]), visible, devices) for d in devs
                        if d.startswith("cuda:") and d.split(":")[1].isdigit()}
                if p["gpu"] in phys:
                    load = ld
                    break
            out.append({"rank": r, "pid": p["pid"], "gpu": p["gpu"], "own_gpu": mine,
                        "owner_rank": owners.get(p["gpu"]), "used_mib": p.get("used_mib"),
                        "host": snap.get("host"), "load": load, "cuda_init": cuda.get("init")})
    return out
