"""torch.distributed's collective functions by name: the one table the probe wraps and a stack is read with.

``C10D`` are the functions of ``distributed_c10d.py`` the probe wraps (probe/hooks.py) and numbers on their
group; ``P2P`` the point-to-point calls it counts per line instead (probe/p2p.py); ``OBJECT_P2P`` the object
forms of send / recv, which reach the probe as the ``send`` / ``recv`` they call.  ``collective_frame`` names
the collective a stack stands in, for attach's py-spy samples and a rank a fatal signal killed alike.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

OBJECT_COLLECTIVES = frozenset({"all_gather_object", "gather_object", "broadcast_object_list",
                                "scatter_object_list"})
C10D = (
    "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor", "reduce_scatter",
    "reduce_scatter_tensor", "all_to_all", "all_to_all_single", "broadcast", "broadcast_object_list",
    "reduce", "gather", "gather_object", "scatter", "scatter_object_list", "barrier", "monitored_barrier",
    "all_reduce_coalesced", "all_gather_coalesced", "_all_gather_base", "_reduce_scatter_base",
    "all_gather_single", "reduce_scatter_single",  # torch >= 2.13; FSDP2's all-gather and reduce-scatter
)
P2P = ("send", "recv", "isend", "irecv", "batch_isend_irecv")
OBJECT_P2P = ("send_object_list", "recv_object_list")
ALL = frozenset(C10D) | frozenset(P2P) | frozenset(OBJECT_P2P)
C10D_FILE = "distributed_c10d.py"


def op_name(function: str | None) -> str:
    """The bare function name (py-spy gives qualified names on Python >= 3.11: ``Class.method``)."""
    return (function or "").rsplit(".", 1)[-1]


def collective_frame(stack: Sequence[Any]) -> tuple[str, Any] | None:
    """(op, frame) of the collective a stack (outermost first; frames with ``path`` and ``function``) stands in.

    The *outermost* of torch's collective functions: the call the user made.  An object collective calls
    tensor collectives (``all_gather_object`` -> ``all_gather`` twice, ``broadcast_object_list`` ->
    ``broadcast`` twice), and the probe records the outer call only (its hooks do not record a collective
    issued inside another), so the innermost frame would name a call no rank's record holds and make a
    false op mismatch.  (A barrier NCCL runs as an all-reduce does so in C++: no Python frame.)"""
    for f in stack:
        if f.path.endswith(C10D_FILE) and op_name(f.function) in ALL:
            return op_name(f.function), f
    return None
