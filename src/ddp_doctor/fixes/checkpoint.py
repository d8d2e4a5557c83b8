"""Safe checkpoint loading in a distributed job: the local device, weights_only, DDP prefixes."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any

import torch

__all__ = ["local_device", "load_checkpoint", "strip_prefix"]

_NESTED_KEYS = ("model", "state_dict", "model_state_dict", "module", "net", "ema")


def local_device() -> torch.device:
    """This rank's device: ``cuda:LOCAL_RANK`` (else the current CUDA device) when CUDA is available, else CPU.

    Use it for ``map_location``, ``.to()`` and ``DDP(device_ids=...)`` so no rank
    touches another rank's GPU (DDP301/DDP302).  Call ``torch.cuda.set_device(
    local_device())`` before any other CUDA call.
    """
    if torch.cuda.is_available():
        n = torch.cuda.device_count()
        lr = os.environ.get("LOCAL_RANK")
        if lr is not None and lr.strip().lstrip("-").isdigit() and n:
            return torch.device("cuda", int(lr) % n)
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _looks_like_state_dict(obj: Any) -> bool:
    return isinstance(obj, dict) and bool(obj) and all(isinstance(k, str) for k in obj) and any(
        isinstance(v, torch.Tensor) for v in obj.values())


def strip_prefix(state_dict: dict, prefix: str = "module.") -> dict:
    """Drop ``prefix`` from every key when *all* keys carry it (a state dict saved from ``ddp_model``
    instead of ``ddp_model.module``); otherwise return it unchanged."""
    if not prefix or not state_dict or not all(isinstance(k, str) and k.startswith(prefix) for k in state_dict):
        return state_dict
    out = OrderedDict((k[len(prefix):], v) for k, v in state_dict.items())
    meta = getattr(state_dict, "_metadata", None)
    if meta is not None:
        out._metadata = OrderedDict((k[len(prefix):] if k.startswith(prefix) else k, v)  # type: ignore[attr-defined]
                                    for k, v in meta.items())
    return out


def load_checkpoint(path, map_location=None, *, weights_only: bool = True, strip: str | None = "module.",
                    **kwargs) -> Any:
    """``torch.load`` done right for a distributed job.

    * ``map_location`` defaults to :func:`local_device` -- without it every rank
      restores CUDA tensors to the device they were saved from (usually
      ``cuda:0``): N copies of the checkpoint and N CUDA contexts on GPU 0, and
      an out-of-memory there (DDP301).
    * ``weights_only=True`` (the safe unpickler: tensors, dicts, numbers) unless
      you pass ``weights_only=False`` for a checkpoint you trust that holds
      arbitrary objects; the error then says so.
    * ``strip="module."``: a state dict saved from the DDP wrapper has every
      key prefixed with ``module.``; the prefix is removed (at the top level and
      under the usual keys ``model``/``state_dict``/``model_state_dict``/...)
      when *every* key has it.  ``strip=None`` keeps keys as saved.

    Example::

        ckpt = load_checkpoint("last.pt")                      # on this rank's device
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
    """
    if map_location is None:
        map_location = local_device()
    try:
        obj = torch.load(path, map_location=map_location, weights_only=weights_only, **kwargs)
    except TypeError as exc:  # a torch too old for weights_only
        if "weights_only" not in str(exc):
            raise
        obj = torch.load(path, map_location=map_location, **kwargs)
    except Exception as exc:
        if weights_only and type(exc).__name__ == "UnpicklingError":
            raise type(exc)(f"{exc}\n\nddp_doctor.fixes.load_checkpoint: {path} holds objects the safe "
                            "(weights_only=True) loader refuses. If you trust this file, pass "
                            "weights_only=False.") from exc
        raise
    if strip:
        if _looks_like_state_dict(obj):
            obj = strip_prefix(obj, strip)
        elif isinstance(obj, dict):
            for key in _NESTED_KEYS:
                if _looks_like_state_dict(obj.get(key)):
                    obj[key] = strip_prefix(obj[key], strip)
    return obj
