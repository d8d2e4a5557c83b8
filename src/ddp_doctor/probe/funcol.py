"""Functional collectives (``torch.distributed._functional_collectives``): what DTensor issues for
``full_tensor()``, ``redistribute`` and its sharding ops, outside ``torch.distributed``'s own functions.

Each is recorded as the c10d collective it is on its process group (an all-gather is
``all_gather_into_tensor`` whether a user or DTensor issued it: the same gloo/NCCL call, numbered in the
same sequence), with its tensors in c10d's layout (output, input).  The call only issues the work (the
result is waited for when the tensor is first used), so it is left at once: a rank that blocks later in
that wait shows no collective, but the position it issued is on record and a peer that pairs a
different call with it is a proven mismatch.  Under ``torch.compile`` the original is called untouched.
"""
from __future__ import annotations

import functools

from ddp_doctor.probe.describe import tensors

# functional collective -> (the c10d collective it is, position of its group argument, output rows factor)
OPS = {
    "all_reduce": ("all_reduce", 2, None),
    "broadcast": ("broadcast", 2, None),
    "all_gather_single": ("all_gather_into_tensor", 2, "mul"),
    "all_gather_single_autograd": ("all_gather_into_tensor", 2, "mul"),
    "all_gather_tensor": ("all_gather_into_tensor", 2, "mul"),
    "all_gather_tensor_autograd": ("all_gather_into_tensor", 2, "mul"),
    "reduce_scatter_single": ("reduce_scatter_tensor", 3, "div"),
    "reduce_scatter_single_autograd": ("reduce_scatter_tensor", 3, "div"),
    "reduce_scatter_tensor": ("reduce_scatter_tensor", 3, "div"),
    "reduce_scatter_tensor_autograd": ("reduce_scatter_tensor", 3, "div"),
    "all_to_all_single": ("all_to_all_single", 3, None),
    "all_to_all_single_autograd": ("all_to_all_single", 3, None),
}


def _process_group(group, tag: str = ""):
    """The ProcessGroup of a functional collective's group (a group, its name, a 1-D mesh, (mesh, dim), ranks)."""
    from torch.distributed import _functional_collectives as fc
    from torch.distributed import distributed_c10d as c10d

    if isinstance(group, list):  # ranks: resolved without the deprecation warning torch gives the user
        return c10d._resolve_process_group(c10d._resolve_group_name_by_ranks_and_tag(group, tag))
    g = fc._resolve_group(group, tag)
    return c10d._resolve_process_group(g) if isinstance(g, str) else g


def _describer(op: str, gpos: int, rows, group_key):
    def call(args, kwargs):
        g = kwargs.get("group", args[gpos] if len(args) > gpos else None)
        pg = _process_group(g, kwargs.get("tag", ""))
        key = group_key(pg)
        if key is None:
            return None, (), ()
        shapes, dtypes = tensors(args[:1], {})
        if rows and shapes and shapes[0] not in ("scalar",):
            dims = shapes[0].split("x")
            n = pg.size()
            dims[0] = str(int(dims[0]) * n if rows == "mul" else int(dims[0]) // n)
            shapes, dtypes = ("x".join(dims), shapes[0]), (dtypes[0], dtypes[0])
        if op == "all_to_all_single":
            for pos, name in ((1, "output_split_sizes"), (2, "input_split_sizes")):
                v = kwargs.get(name, args[pos] if len(args) > pos else None)
                if v is not None:
                    shapes += (f"{name}={[int(x) for x in list(v)[:64]]}".replace(" ", ""),)
        return key, shapes, dtypes
    return call


def patch(wrap, group_key) -> None:
    """Replace each functional collective by ``wrap(fn, op, call=...)``, bypassed while torch compiles."""
    import torch
    from torch.distributed import _functional_collectives as fc

    compiling = torch.compiler.is_compiling
    for fname, (op, gpos, rows) in OPS.items():
        fn = getattr(fc, fname, None)
        if fn is None or hasattr(fn, "__ddp_doctor_wrapped__"):
            continue
        recorded = wrap(fn, op, call=_describer(op, gpos, rows, group_key))

        def outer(*args, _fn=fn, _recorded=recorded, **kwargs):
            return _fn(*args, **kwargs) if compiling() else _recorded(*args, **kwargs)

        outer = functools.wraps(fn)(outer)
        outer.__ddp_doctor_wrapped__ = fn
        setattr(fc, fname, outer)
