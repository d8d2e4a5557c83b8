"""Sizes that explain a mismatch: who sends how many rows to whom in an ``all_to_all_single``, each rank's
list length in an object collective or a tensor list, and the fix that fits (exchange the counts first, pad,
box the list).  Two ranks' calls printed as the same "all_to_all_single(32x32, 32x32)" explain nothing;
the probe records the split sizes and list lengths (``probe/describe.py``) and this module reads them."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ddp_doctor.evidence import Collective
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.live import group_ranks

_KV = re.compile(r"^(\w+)=\[?([-\d,]*)\]?$")


@dataclass(frozen=True, slots=True)
class Sized:
    """What the sizes show (a sentence to append to the mismatch) and the fix for that case."""
    text: str
    fix: str


def sizes_of(c: Collective) -> dict[str, tuple[int, ...]]:
    """The "name=[1,2]" / "objects=3" entries the probe added to a call's shapes."""
    out = {}
    for s in c.shapes:
        m = _KV.match(s)
        if m:
            out[m.group(1)] = tuple(int(x) for x in m.group(2).split(",") if x)
    return out


def tensor_shapes(c: Collective) -> tuple[str, ...]:
    """The call's tensor shapes, without the sizes entries."""
    return tuple(s for s in c.shapes if not _KV.match(s))


def _rows(shape: str | None) -> int | None:
    try:
        return int(shape.split("x")[0]) if shape and shape != "scalar" and not shape.startswith("[") else None
    except ValueError:
        return None


def _splits(c: Collective, n: int, key: str, which: int) -> tuple[int, ...] | None:
    """A rank's split sizes (``key``), or the even split of its tensor (``which``: 0 output, 1 input)."""
    got = sizes_of(c).get(key)
    if got:
        return got
    shapes = tensor_shapes(c)
    rows = _rows(shapes[which]) if len(shapes) > which else None
    return None if rows is None or n == 0 or rows % n else (rows // n,) * n


def _all_to_all(calls: dict[int, Collective], members: list[int]) -> Sized | None:
    n = len(members)
    sends = {r: _splits(c, n, "input_split_sizes", 1) for r, c in calls.items()}
    wants = {r: _splits(c, n, "output_split_sizes", 0) for r, c in calls.items()}
    wrong = []
    for a in sorted(calls):
        for b in sorted(calls):
            sa, wb = sends[a], wants[b]
            if sa is None or wb is None or len(sa) != n or len(wb) != n or a not in members or b not in members:
                continue
            ia, ib = members.index(a), members.index(b)
            if sa[ib] != wb[ia]:
                wrong.append(f"rank {a} sends {sa[ib]} rows to rank {b}, which expects {wb[ia]} from it")
    if not wrong:
        return None
    each = "; ".join(f"rank {r}: input_split_sizes={list(sends[r] or ())}, output_split_sizes={list(wants[r] or ())}"
                     for r in sorted(calls))
    return Sized(f" The split sizes disagree: {'; '.join(wrong)} ({each}). What rank a sends to rank b must be "
                 "what rank b expects from rank a.", runtime_fix("DDP203.splits"))


def _lists(calls: dict[int, Collective], op: str) -> Sized | None:
    lens = {r: sizes_of(c).get("objects") for r, c in calls.items()}
    if any(v is None for v in lens.values()) or len({v[0] for v in lens.values() if v}) < 2:
        return None
    each = ", ".join(f"rank {r}: {v[0]}" for r, v in sorted(lens.items()) if v)
    return Sized(f" The object lists differ in length ({each}): {op} sends one size per list entry, so the "
                 "lists must have the same length on every rank.", runtime_fix("DDP203.lists"))


def _tensor_sizes(calls: dict[int, Collective], op: str) -> Sized | None:
    shapes = {r: tensor_shapes(c) for r, c in calls.items()}
    if len({s for s in shapes.values()}) < 2 or any(not s for s in shapes.values()):
        return None
    return Sized("", runtime_fix("DDP203.pad"))


def explain(calls: dict[int, Collective | None], world_size: int) -> Sized | None:
    """The sizes behind a mismatch of one op whose sizes are per rank, or None."""
    known = {r: c for r, c in calls.items() if c is not None}
    ops = {c.op for c in known.values()}
    if len(known) < 2 or len(ops) != 1:
        return None
    op = ops.pop()
    group = next(iter(known.values())).group
    members = sorted(group_ranks(group, world_size) or known)
    if op == "all_to_all_single":
        return _all_to_all(known, members)
    if op in ("broadcast_object_list", "scatter_object_list", "all_gather_object"):
        return _lists(known, op)
    if op in ("all_gather", "all_gather_into_tensor", "all_gather_single", "reduce_scatter",
              "reduce_scatter_tensor", "reduce_scatter_single", "_all_gather_base"):
        return _tensor_sizes(known, op)
    return None
