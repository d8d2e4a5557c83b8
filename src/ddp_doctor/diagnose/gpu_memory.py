"""DDP301 / DDP302: memory and a CUDA context on another rank's GPU, with the cause when the probe saw it
(``torch.load`` without ``map_location``, CUDA used before ``torch.cuda.set_device``).  Reads the NVML
samples the probes took (one per host) in the perf family's wire form."""
from __future__ import annotations

from typing import Any

from ddp_doctor.diagnose.perfwire import wire_loc, wire_ranks, wire_where
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.findings import runtime_fix


def diagnose_gpu_memory(ev: dict[str, Any]) -> list[Draft]:
    ranks = wire_ranks(ev)
    gpu = ev.get("gpu")
    if not gpu:  # the probe's NVML samples: one per host (taken by its local rank 0)
        by_host = {}
        for st in ranks.values():
            snap = st.get("gpu")
            if snap:
                by_host.setdefault(snap.get("host"), snap)
        gpu = list(by_host.values())
    if not gpu:
        return []
    from ddp_doctor.gpu import foreign_contexts

    out = []
    for item in foreign_contexts(gpu, ranks):
        out.append(_gpu_finding(item))
    return out


def _gpu_finding(item: dict[str, Any]) -> Draft:
    r, dev, own, mib = item["rank"], item["gpu"], item["own_gpu"], item["used_mib"]
    owner = item.get("owner_rank")
    whose = f"rank {owner}'s GPU" if owner is not None else "a GPU no rank owns"
    base = (f"rank {r} (pid {item['pid']}) holds {mib} MiB and a CUDA context on GPU {dev} ({whose}) besides its "
            f"own GPU {own}: memory is uneven across GPUs and GPU {dev} can run out of memory first.")
    load = item.get("load")
    if load:
        msg = (base + f" Cause: torch.load at {wire_where(load.get('site'))} (map_location={load.get('map_location')!r}) "
               f"put tensors on {', '.join(load.get('devices') or [])}.")
        return Draft("DDP301", msg, runtime_fix("DDP301"),
                     location=wire_loc(load.get("site")), ranks=[r], evidence=item)
    init = item.get("cuda_init")
    where = f" Cause: CUDA was first used at {wire_where(init.get('site'))} on device {init.get('device')}" \
        f"{' before torch.cuda.set_device()' if init.get('before_set_device') else ''}." if init else ""
    return Draft("DDP302", base + where, runtime_fix("DDP302"),
                 location=wire_loc(init.get("site")) if init else None, ranks=[r], evidence=item)
