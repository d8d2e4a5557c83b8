"""gather_variable: all_gather for tensors whose shapes differ between ranks."""
from __future__ import annotations

import torch
import torch.distributed as dist

from ddp_doctor.fixes import _dist

__all__ = ["gather_variable"]

_MAX_DIMS = 8
_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]


def gather_variable(tensor: torch.Tensor, group=None, cat: bool = False):
    """Gather ``tensor`` from every rank even when the shapes differ (e.g. a filtered last batch).

    ``dist.all_gather`` needs equal shapes on every rank: with gloo a mismatch
    aborts with a bare ``gloo::EnforceNotMet``, with NCCL it can hang or
    corrupt.  This exchanges the shapes first (one small all_gather), pads
    every tensor to the largest shape, all-gathers, and trims each result back.

    Returns a list with one tensor per rank (rank order), or, with
    ``cat=True``, their concatenation along dim 0.  Ranks must agree on the
    number of dimensions and the dtype; if they do not, every rank raises the
    same ``ValueError`` (instead of a crash or hang in the collective).

    Example::

        preds = model(x).argmax(1)                # 32 on rank 0, 17 on rank 1
        all_preds = gather_variable(preds, cat=True)   # 49 on every rank
    """
    if not isinstance(tensor, torch.Tensor):
        raise TypeError("gather_variable takes a tensor")
    if not _dist.active(group):
        return tensor.clone() if cat else [tensor.clone()]
    if tensor.dim() > _MAX_DIMS:
        raise ValueError(f"gather_variable supports up to {_MAX_DIMS} dimensions")
    world = _dist.world_size(group)
    dev = _dist.comm_device(group)
    dcode = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else -1
    meta = torch.full((2 + _MAX_DIMS,), -1, dtype=torch.int64, device=dev)
    meta[0] = tensor.dim()
    meta[1] = dcode
    if tensor.dim():
        meta[2:2 + tensor.dim()] = torch.tensor(tensor.shape, dtype=torch.int64)
    metas = [torch.empty_like(meta) for _ in range(world)]
    dist.all_gather(metas, meta, group=group)
    metas_l = [m.tolist() for m in metas]
    ndims = {m[0] for m in metas_l}
    dcodes = {m[1] for m in metas_l}
    if len(ndims) != 1 or len(dcodes) != 1 or -1 in dcodes:
        desc = ", ".join(f"rank {r}: dim={m[0]} dtype={_DTYPES[m[1]] if 0 <= m[1] < len(_DTYPES) else '?'}"
                         for r, m in enumerate(metas_l))
        raise ValueError(f"gather_variable: ranks disagree on dimensions or dtype ({desc})")
    nd = tensor.dim()
    shapes = [tuple(m[2:2 + nd]) for m in metas_l]
    max_shape = tuple(max(s[d] for s in shapes) for d in range(nd))
    src = tensor.detach().to(dev)
    if tuple(src.shape) != max_shape:
        padded = torch.zeros(max_shape, dtype=src.dtype, device=dev)
        padded[tuple(slice(0, n) for n in src.shape)] = src
        src = padded
    else:
        src = src.contiguous()
    out = [torch.empty(max_shape, dtype=src.dtype, device=dev) for _ in range(world)]
    dist.all_gather(out, src, group=group)
    result = [o[tuple(slice(0, n) for n in s)].to(tensor.device) for o, s in zip(out, shapes)]
    if cat:
        return torch.cat(result, dim=0) if nd else torch.stack(result)
    return result
