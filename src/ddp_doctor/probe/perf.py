"""Probe hooks for the performance / GPU-memory diagnoses (DDP301, DDP302).

Wired in by the probe (two lines, owned by ``run``)::

    from ddp_doctor.probe import perf as _perf
    _perf.install(REC)                  # in hooks.install(), once
    state.update(_perf.state(rec))      # in the publisher's per-rank state

Records only (like the rest of ``probe/``), exception-safe, no collective:

- ``torch.load``: call site, ``map_location`` and the devices the loaded tensors
  landed on (``loads``);
- the rank's first CUDA use (``torch.cuda._lazy_init``): site, device, whether
  ``torch.cuda.set_device`` had been called, the device UUID and
  ``CUDA_VISIBLE_DEVICES`` (``cuda``);
- on local rank 0 of a node with NVML, an NVML snapshot every few seconds,
  keeping the one with the most memory held outside a process's own GPU (``gpu``).
"""
from __future__ import annotations

import functools
import os
import sys
import threading
import time
from typing import Any

_loads: list[dict[str, Any]] = []
_cuda: dict[str, Any] = {}
_gpu: dict[str, Any] = {"worst": None, "last": None}
_set_device_called = False
_installed = False
MAX_LOADS = 20
NVML_PERIOD_S = 5.0


def _site(frame) -> dict[str, Any] | None:
    try:
        from ddp_doctor.probe.recorder import user_site

        s = user_site(frame)
        return None if s is None else {"path": s[0], "line": s[1], "function": s[2]}
    except Exception:
        return None


def tensor_devices(obj: Any, limit: int = 100_000) -> list[str]:
    """Sorted devices of the tensors inside a (nested) loaded object."""
    import torch

    devs: set[str] = set()
    stack = [obj]
    seen = 0
    while stack and seen < limit:
        o = stack.pop()
        seen += 1
        if isinstance(o, torch.Tensor):
            devs.add(str(o.device))
        elif isinstance(o, dict):
            stack.extend(o.values())
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
        elif hasattr(o, "state_dict") and hasattr(o, "parameters"):  # a pickled nn.Module
            try:
                stack.extend(o.state_dict().values())
            except Exception:
                pass
    return sorted(devs)


def _patch_load() -> None:
    import torch

    orig = torch.load
    if hasattr(orig, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig)
    def load(*args, **kwargs):
        result = orig(*args, **kwargs)
        try:
            if len(_loads) < MAX_LOADS:
                ml = kwargs.get("map_location", args[1] if len(args) > 1 else None)
                _loads.append({"site": _site(sys._getframe(1)), "map_location": None if ml is None else repr(ml)[:80],
                               "devices": tensor_devices(result)})
        except Exception:
            pass
        return result

    load.__ddp_doctor_wrapped__ = orig
    torch.load = load


def _patch_cuda() -> None:
    import torch

    cuda = torch.cuda
    orig_init = cuda._lazy_init
    orig_set = cuda.set_device
    if hasattr(orig_init, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig_set)
    def set_device(device):
        global _set_device_called
        _set_device_called = True
        return orig_set(device)

    @functools.wraps(orig_init)
    def _lazy_init():
        first = not cuda.is_initialized()
        orig_init()
        if first and not _cuda:
            try:
                dev = cuda.current_device()
                _cuda.update({"init": {"site": _site(sys._getframe(1)), "device": dev,
                                       "before_set_device": not _set_device_called},
                              "device": dev, "visible": os.environ.get("CUDA_VISIBLE_DEVICES")})
                try:
                    _cuda["uuid"] = "GPU-" + str(cuda.get_device_properties(dev).uuid)
                except Exception:
                    pass
            except Exception:
                pass

    _lazy_init.__ddp_doctor_wrapped__ = orig_init
    set_device.__ddp_doctor_wrapped__ = orig_set
    cuda._lazy_init = _lazy_init
    cuda.set_device = set_device


def _nvml_loop() -> None:
    from ddp_doctor import gpu

    while True:
        snap = gpu.snapshot()
        if snap is None:
            return  # no NVML here: stop sampling
        _gpu["last"] = snap
        if gpu.foreign_bytes(snap) >= gpu.foreign_bytes(_gpu["worst"]):
            _gpu["worst"] = snap
        time.sleep(NVML_PERIOD_S)


def install(rec=None) -> None:
    """Install the hooks (idempotent, never raises)."""
    global _installed
    if _installed:
        return
    _installed = True
    for patch in (_patch_load, _patch_cuda):
        try:
            patch()
        except Exception:
            pass
    try:
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("DDP_DOCTOR_NVML", "1") != "0":
            import importlib.util

            if importlib.util.find_spec("pynvml") is not None:
                threading.Thread(target=_nvml_loop, name="ddp-doctor-nvml", daemon=True).start()
    except Exception:
        pass


def state(rec=None) -> dict[str, Any]:
    """This rank's perf records, for the published per-rank state."""
    try:
        cuda = dict(_cuda)
        if cuda:
            try:
                import torch

                dev = cuda.get("device", 0)
                cuda["reserved_mib"] = int(torch.cuda.memory_reserved(dev) // (1024 * 1024))
            except Exception:
                pass
        return {"loads": list(_loads), "cuda": cuda or None, "gpu": _gpu["worst"] or _gpu["last"]}
    except Exception:
        return {}
