"""What a collective call passes, as the short strings a fingerprint carries: tensor shapes and dtypes, and
for the calls whose sizes differ per rank by design (all_to_all_single's split sizes, object lists) those
sizes, so that a mismatch can say who sends how many rows to whom (``diagnose/sizes.py``).  Those extra
strings ("input_split_sizes=[20, 16]", "objects=3") are never compared as shapes (``evidence.agreement``)."""
from __future__ import annotations

_SPLITS = {"all_to_all_single": (2, 3)}  # positions of output_split_sizes, input_split_sizes
_OBJECT_LISTS = {"broadcast_object_list": 0, "scatter_object_list": 1, "all_gather_object": 0}


def tensors(args, kwargs) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The shapes ("10x3", a list "[4,4]") and dtypes of a call's first three tensor arguments."""
    import torch

    shapes: list[str] = []
    dtypes: list[str] = []
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            shapes.append("x".join(map(str, a.shape)) or "scalar")
            dtypes.append(str(a.dtype).replace("torch.", ""))
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            more = "..." if len(a) > 8 else ""
            shapes.append("[" + ",".join("x".join(map(str, t.shape)) for t in a[:8]) + more + "]")
            dtypes.append(str(a[0].dtype).replace("torch.", ""))
        if len(shapes) >= 3:
            break
    return tuple(shapes), tuple(dtypes)


def _arg(args, kwargs, i: int, name: str):
    return kwargs[name] if name in kwargs else (args[i] if len(args) > i else None)


def describe(op: str, args, kwargs) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``tensors`` plus the per-rank sizes of ``op``'s call, where it has them."""
    if op in _SPLITS:
        o, i = _SPLITS[op]
        shapes, dtypes = tensors(args[:min(o, i)], {k: v for k, v in kwargs.items() if k in ("output", "input")})
        extra = []
        for pos, name in ((o, "output_split_sizes"), (i, "input_split_sizes")):
            v = _arg(args, kwargs, pos, name)
            if v is not None:
                extra.append(f"{name}={[int(x) for x in list(v)[:64]]}".replace(" ", ""))
        return shapes + tuple(extra), dtypes
    shapes, dtypes = tensors(args, kwargs)
    if op in _OBJECT_LISTS:
        lst = _arg(args, kwargs, _OBJECT_LISTS[op], "object_list" if op != "scatter_object_list" else
                   "input_object_list")
        if isinstance(lst, (list, tuple)):
            return shapes + (f"objects={len(lst)}",), dtypes
    return shapes, dtypes
