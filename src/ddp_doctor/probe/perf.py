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
- host-to-device copies (``Tensor.to`` / ``Tensor.cuda`` of a CPU tensor to CUDA;
  installed only where CUDA is available): total time, and ``h2d`` timeline
  events so a step's copy time is split from its compute (DDP401);
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
_h2d = {"s": 0.0, "n": 0}
_H2D_TARGET = "cuda"  # device type of a host-to-device copy (tests use "meta": no GPU here)
_rec = None
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


def _note_h2d(dt: float) -> None:
    _h2d["s"] += dt
    _h2d["n"] += 1
    rec = _rec
    if rec is not None and dt > 0.0002:
        try:
            rec.timeline.append((rec.now() - dt, "h2d", dt, "host-to-device copy"))
        except Exception:
            pass


def _patch_h2d() -> None:
    import torch

    T = torch.Tensor
    orig_to, orig_cuda = T.to, T.cuda
    if hasattr(orig_to, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig_to)
    def to(self, *args, **kwargs):
        if self.device.type != "cpu":
            return orig_to(self, *args, **kwargs)
        t = time.perf_counter()
        out = orig_to(self, *args, **kwargs)
        try:
            if out.device.type == _H2D_TARGET:
                _note_h2d(time.perf_counter() - t)
        except Exception:
            pass
        return out

    @functools.wraps(orig_cuda)
    def cuda(self, *args, **kwargs):
        if self.device.type != "cpu":
            return orig_cuda(self, *args, **kwargs)
        t = time.perf_counter()
        out = orig_cuda(self, *args, **kwargs)
        try:
            _note_h2d(time.perf_counter() - t)
        except Exception:
            pass
        return out

    to.__ddp_doctor_wrapped__ = orig_to
    cuda.__ddp_doctor_wrapped__ = orig_cuda
    T.to = to
    T.cuda = cuda


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
    global _installed, _rec
    if _installed:
        return
    _installed = True
    _rec = rec
    for patch in (_patch_load, _patch_cuda):
        try:
            patch()
        except Exception:
            pass
    try:
        import torch

        # no CUDA: no copy to time, no per-call cost; DDP_DOCTOR_H2D=0 opts out (e.g. heavy torch.compile use)
        if torch.cuda.is_available() and os.environ.get("DDP_DOCTOR_H2D", "1") != "0":
            _patch_h2d()
    except Exception:
        pass
    try:
        if os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("DDP_DOCTOR_NVML", "1") != "0":
            import importlib.util

            if importlib.util.find_spec("pynvml") is not None:
                threading.Thread(target=_nvml_loop, name="ddp-doctor-nvml", daemon=True).start()
    except Exception:
        pass


def _cpus() -> int | None:
    """CPUs this process may run on (the cpuset of a container), else the machine's."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count()


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
        try:
            load = [round(x, 2) for x in os.getloadavg()]
        except OSError:
            load = None
        return {"loads": list(_loads), "cuda": cuda or None, "gpu": _gpu["worst"] or _gpu["last"],
                "h2d": {"copies": _h2d["n"], "time_s": round(_h2d["s"], 4)} if _h2d["n"] else None,
                "loadavg": load, "cpu_count": _cpus()}
    except Exception:
        return {}
