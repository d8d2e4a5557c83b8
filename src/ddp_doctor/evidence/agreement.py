"""What torch requires every rank's call at one position of a group to agree on: the only difference in
two ranks' collectives that proves a desync (docs/verdicts.md, "What proves a desync").  One definition for
the live watcher, the root's cross-node codes and Flight Recorder dumps."""
from __future__ import annotations

from ddp_doctor.evidence.ops import OBJECT_COLLECTIVES

# The group key of process-group creation (new_group and the torch APIs that call it): every rank must
# make these calls in the same order with the same arguments, and torch pairs them by a counter of its
# own (the group's name), not by a sequence number of the world group, so they get a sequence of their own.
GROUP_CREATION = "world.new_group"

# Collectives whose tensors torch requires to have the same shape on every rank (each rank's call is recorded
# under the name the user called; the legacy names are the same collective).
EQUAL_SHAPES = frozenset({"all_reduce", "all_reduce_coalesced", "broadcast", "reduce", "all_gather_into_tensor",
                          "reduce_scatter_tensor", "barrier", "monitored_barrier"})
# The same collective under another name: torch's legacy names and Flight Recorder's profiling names.
OP_ALIASES = {"_all_gather_base": "all_gather_into_tensor", "_reduce_scatter_base": "reduce_scatter_tensor",
              "_broadcast_oop": "broadcast", "_reduce_oop": "reduce", "allreduce_coalesced": "all_reduce_coalesced",
              "all_reduce_barrier": "barrier", "all_to_all_v_single": "all_to_all_single", "all_gather_v": "all_gather",
              "reduce_scatter_v": "reduce_scatter", "all_gather_single": "all_gather_into_tensor",
              "reduce_scatter_single": "reduce_scatter_tensor"}
ROOT = "root="  # a rooted collective's root among its shapes ("root=0", probe/describe.py)


def must_agree(op: str, group: str | None, shapes: tuple[str, ...], dtypes: tuple[str, ...]) -> tuple:
    """The op (aliases folded); tensor shapes only where torch requires equal shapes; dtypes.  Not where sizes
    are per rank by design: all_to_all splits, gather/scatter lists present on the root only,
    reduce_scatter/all_gather inputs of uneven size (NCCL), object collectives (each rank's pickled size);
    never the line or the training position.  A group creation agrees on its arguments."""
    op = OP_ALIASES.get(op, op)
    if group == GROUP_CREATION or op in EQUAL_SHAPES or op.startswith("ddp."):
        return (op, shapes, dtypes)  # (a broadcast's or reduce's root among its shapes: compared too)
    roots = tuple(s for s in shapes if s.startswith(ROOT))  # the source/destination every rank must name
    if op in OBJECT_COLLECTIVES:
        return (op, roots) if roots else (op,)
    if op == "all_gather":  # every rank's output list holds every rank's input: the lists agree
        return (op, tuple(s for s in shapes if s.startswith("[")), tuple(sorted(set(dtypes))))
    return (op, roots, tuple(sorted(set(dtypes))))
