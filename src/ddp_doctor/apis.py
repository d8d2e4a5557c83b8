"""The torch APIs that issue collectives on the user's behalf, named as the user called them.

A collective issued inside ``dcp.save`` or an FSDP2 module's forward is the user's call of ``dcp.save``
or of the model, not of the ``gather_object`` / ``all_gather_single`` torch makes inside it: the user
never wrote those, and the fix is about the call they did write ("every rank must call it").  The probe
walks the frames between the collective and the user's frame (only when the collective was issued from
library code) and records the outermost one found in :data:`TABLE`; diagnosis words findings with it.

One line per entry: (file under ``torch/``, function qualname as in the frame's code object, the name the
user knows, why every rank must make that call).  Stdlib only: the probe imports it in every rank.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Api:
    """One torch entry point that issues collectives: where its code lives and how it reads to the user."""
    path: str       # file under torch/, "/"-separated
    qualname: str   # its code object's co_qualname
    name: str       # the call as the user wrote it
    why: str        # what it does with every rank: why every rank must call it
    fix: str = ""   # what to write instead, where the generic fix of a rank-conditional collective is wrong


_CK = "distributed/checkpoint/"
_FSDP = "distributed/fsdp/_fully_shard/"
_ZERO = "distributed/optim/zero_redundancy_optimizer.py"
_PP = "distributed/pipelining/schedules.py"
_DT = "distributed/tensor/_api.py"
_FWD = "the forward of an FSDP2 (`fully_shard`) module"
_BWD = "the backward through an FSDP2 (`fully_shard`) module"
_AG = "it all-gathers the module's parameter shards from every rank of its mesh"
_RS = "it all-gathers parameters and reduce-scatters gradients across every rank of its mesh"
_FSDP_FIX = ("Run the sharded model on every rank of its mesh, the same number of times (each rank on its share of "
             "the data, then reduce the metric with all_reduce); or evaluate an unsharded copy on rank 0 (its full "
             "state dict from `get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))`, gathered "
             "on every rank, loaded into a plain module).")
_DCP_FIX = ("Call `dcp.save` / `dcp.load` on every rank with that rank's state dict (DCP decides which rank writes "
            "what); for one file written by rank 0 alone, gather a full state dict on every rank and `torch.save` it "
            "on rank 0.")
_SD_WHY = "it gathers every rank's shards of the model (an all-gather of each parameter for a full state dict)"
_SD_FIX = ("Call it on every rank (`StateDictOptions(full_state_dict=True, cpu_offload=True)` keeps the full result "
           "on rank 0 only), then save or evaluate on rank 0 alone.")

TABLE: tuple[Api, ...] = (
    Api(_CK + "state_dict_saver.py", "save", "dcp.save", "it gathers every rank's save plan and agrees on one",
        _DCP_FIX),
    Api(_CK + "state_dict_saver.py", "async_save", "dcp.async_save", "it gathers every rank's save plan"),
    Api(_CK + "state_dict_saver.py", "save_state_dict", "dcp.save_state_dict", "it gathers every rank's save plan"),
    Api(_CK + "state_dict_loader.py", "load", "dcp.load", "it gathers every rank's load plan and scatters the reads",
        _DCP_FIX),
    Api(_CK + "state_dict_loader.py", "load_state_dict", "dcp.load_state_dict", "it gathers every rank's load plan"),
    Api(_CK + "state_dict.py", "get_model_state_dict", "get_model_state_dict", _SD_WHY, _SD_FIX),
    Api(_CK + "state_dict.py", "get_optimizer_state_dict", "get_optimizer_state_dict", _SD_WHY, _SD_FIX),
    Api(_CK + "state_dict.py", "get_state_dict", "get_state_dict", _SD_WHY, _SD_FIX),
    Api(_CK + "state_dict.py", "set_model_state_dict", "set_model_state_dict",
        "it scatters or broadcasts the loaded state to every rank's shards"),
    Api(_CK + "state_dict.py", "set_state_dict", "set_state_dict",
        "it scatters or broadcasts the loaded state to every rank's shards"),
    Api("nn/utils/clip_grad.py", "clip_grad_norm_", "clip_grad_norm_",
        "with sharded (DTensor) gradients the total norm is all-reduced across the mesh",
        "Call `clip_grad_norm_` on every rank (each rank clips its own shard with the one total norm), and log the "
        "norm it returns on rank 0 only."),
    Api(_ZERO, "ZeroRedundancyOptimizer.consolidate_state_dict", "ZeroRedundancyOptimizer.consolidate_state_dict",
        "each rank broadcasts its shard of the optimizer state, so every rank must take part, not only `to`",
        "Call `optimizer.consolidate_state_dict(to=0)` on every rank, then `optimizer.state_dict()` (and the save) "
        "on rank 0 only."),
    Api(_ZERO, "ZeroRedundancyOptimizer.step", "ZeroRedundancyOptimizer.step",
        "each rank broadcasts the parameters it owns after stepping them"),
    Api(_FSDP + "_fsdp_state.py", "FSDPState._pre_forward", _FWD, _AG, _FSDP_FIX),
    Api(_FSDP + "_fsdp_state.py", "FSDPState._pre_backward", _BWD, _RS, _FSDP_FIX),
    Api(_FSDP + "_fsdp_state.py", "FSDPState._root_post_backward_final_callback", _BWD, _RS, _FSDP_FIX),
    Api(_FSDP + "_fsdp_param_group.py", "RegisterPostBackwardFunction.backward", _BWD, _RS, _FSDP_FIX),
    Api(_FSDP + "_fully_shard.py", "FSDPModule.unshard", "FSDPModule.unshard", _AG),
    Api(_DT, "DTensor.full_tensor", "DTensor.full_tensor", "it all-gathers the shards held by every rank of the mesh",
        "Call `full_tensor()` on every rank of the mesh (then use the result on rank 0 only)."),
    Api(_DT, "DTensor.redistribute", "DTensor.redistribute", "it moves shards between every rank of the mesh"),
    Api(_DT, "distribute_tensor", "distribute_tensor", "it scatters or broadcasts the tensor over the mesh"),
    Api(_PP, "PipelineScheduleSingle.step", "the pipeline schedule's step",
        "every stage sends and receives each micro-batch"),
    Api(_PP, "PipelineScheduleMulti.step", "the pipeline schedule's step",
        "every stage sends and receives each micro-batch"),
)

# the count of a pipeline schedule's ``step`` calls per user line, in a rank's site counts (probe/p2p.py)
STEP_OP = "api.step"

_BY_QUALNAME: dict[str, tuple[Api, ...]] = {}
for _a in TABLE:
    _BY_QUALNAME[_a.qualname] = _BY_QUALNAME.get(_a.qualname, ()) + (_a,)
BY_NAME: dict[str, Api] = {a.name: a for a in TABLE}


def lookup(filename: str, qualname: str) -> Api | None:
    """The table's entry for a frame's code (file name, co_qualname), or None."""
    cands = _BY_QUALNAME.get(qualname)
    if not cands:
        return None
    norm = filename.replace("\\", "/")
    for a in cands:
        if norm.endswith("/torch/" + a.path):
            return a
    return None


def collective_why(name: str) -> str:
    """"`dcp.save` is collective: every rank must call it (it gathers ...)" for an API name on record."""
    a = BY_NAME.get(name)
    reason = f" ({a.why})" if a else ""
    return f"`{name}` is collective: every rank must call it{reason}" if not name.startswith("the ") else \
        f"{name} is collective: every rank must run it{reason}"


def api_fix(name: str | None) -> str:
    """The fix of a rank-conditional call of API ``name`` ("" where the generic one fits)."""
    a = BY_NAME.get(name) if name else None
    return a.fix if a else ""
