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


# the root of a rooted collective: (position, keyword) of its global rank, the group-rank keyword, and the
# position of its `group` (torch's signatures: reduce(tensor, dst, op, group, ...))
_ROOTS = {"broadcast": (1, "src", "group_src", 2), "reduce": (1, "dst", "group_dst", 3),
          "gather": (2, "dst", "group_dst", 3), "scatter": (2, "src", "group_src", 3),
          "broadcast_object_list": (1, "src", "group_src", 2), "gather_object": (2, "dst", "group_dst", 3),
          "scatter_object_list": (2, "src", "group_src", 3)}


# the rooted collectives whose root torch takes to be global rank 0 when neither it nor the group rank is given
_ROOT_DEFAULTS_TO_0 = frozenset({"gather", "scatter", "gather_object", "broadcast_object_list", "scatter_object_list"})


def root(op: str, args, kwargs) -> str | None:
    """"root=N": the global rank a rooted collective names as its source or destination (every rank must name
    the same one; a group rank is turned into its global rank), or None where it cannot be read for sure."""
    pos, name, group_name, gpos = _ROOTS[op]
    try:
        import torch.distributed as dist

        if kwargs.get(group_name) is not None:
            g = kwargs.get("group") if "group" in kwargs else (args[gpos] if len(args) > gpos else None)
            return f"root={int(dist.get_global_rank(g or dist.group.WORLD, int(kwargs[group_name])))}"
        v = _arg(args, kwargs, pos, name)
        if v is None and op in _ROOT_DEFAULTS_TO_0:
            v = 0  # torch's own default: a rank omitting it and one passing 0 name the same root
        return f"root={int(v)}" if v is not None else None
    except Exception:  # noqa: BLE001 - a root we cannot read is never compared
        return None


def describe(op: str, args, kwargs) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``tensors`` plus the per-rank sizes of ``op``'s call, where it has them, and a rooted call's root."""
    shapes, dtypes = _describe(op, args, kwargs)
    r = root(op, args, kwargs) if op in _ROOTS else None
    return (shapes + (r,), dtypes) if r else (shapes, dtypes)


def _describe(op: str, args, kwargs) -> tuple[tuple[str, ...], tuple[str, ...]]:
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
