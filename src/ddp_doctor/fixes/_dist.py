"""Small torch.distributed helpers shared by the fixes (torch + stdlib only)."""
from __future__ import annotations

import torch
import torch.distributed as dist


def active(group=None) -> bool:
    """True when torch.distributed is initialised and the group has more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1


def rank(group=None) -> int:
    return dist.get_rank(group) if dist.is_available() and dist.is_initialized() else 0


def world_size(group=None) -> int:
    return dist.get_world_size(group) if dist.is_available() and dist.is_initialized() else 1


def comm_device(group=None) -> torch.device:
    """The device a tensor must live on for a collective on ``group``.

    NCCL only takes CUDA tensors; gloo (and a mixed ``cpu:gloo,cuda:nccl``
    backend) takes CPU tensors, which avoids a device round trip for flags.
    """
    try:
        backend = str(dist.get_backend(group)).lower()
    except Exception:
        return torch.device("cpu")
    if "gloo" in backend or "mpi" in backend or "nccl" not in backend:
        return torch.device("cpu")
    return torch.device("cuda", torch.cuda.current_device())


def int_tensor(values, group=None) -> torch.Tensor:
    return torch.tensor(list(values), dtype=torch.int64, device=comm_device(group))
