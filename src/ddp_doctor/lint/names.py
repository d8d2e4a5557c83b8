"""Names the linter knows (torch, Fabric, accelerate, Lightning APIs; rank-ish variable names) and
small helpers over ``ast`` name chains and call arguments.  No state: shared by every other module."""
from __future__ import annotations

import ast
import re
from typing import Any

WORLD = 4
RANKS = range(WORLD)

# ---------------------------------------------------------------- names ----
DDP_CLASSES = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DistributedDataParallel",
    # the other data-parallel wrappers whose forward takes part in collectives
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    "apex.parallel.DistributedDataParallel",
}
# FSDP2: ``fully_shard(module)`` shards the module in place (and returns it); under any of its module paths
FULLY_SHARD = {
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed.fsdp._fully_shard.fully_shard",
    "torch.distributed.fsdp._fully_shard._fully_shard.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard.fully_shard",
}
DDP_CLASSES |= FULLY_SHARD
# wrappers whose every forward all-gathers parameter shards from every rank, under no_grad too and whatever
# the module's buffers: no forward of theirs is harmless on a subset of ranks
SHARDING_WRAPPERS = FULLY_SHARD | {
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
}
SET_DEVICE = {"torch.cuda.set_device", "torch.cuda.device"}  # pin this process's current CUDA device
# a device mesh over "cuda" sets the current device from LOCAL_RANK (or global rank % GPUs per host) when
# nothing has been put on a GPU yet (torch/distributed/device_mesh.py, _setup_world_group_and_device)
DEVICE_MESH = {"torch.distributed.device_mesh.init_device_mesh", "torch.distributed.init_device_mesh",
               "torch.distributed.device_mesh.DeviceMesh", "torch.distributed.DeviceMesh",
               "torch.distributed._tensor.init_device_mesh", "torch.distributed._tensor.DeviceMesh",
               "torch.distributed.tensor.init_device_mesh", "torch.distributed.tensor.DeviceMesh"}


def sets_current_device(qual: str | None, call: ast.Call) -> bool:
    """``torch.cuda.set_device(i)``, or a CUDA device mesh (``init_device_mesh("cuda", (world,))``), which
    sets the current device itself; a mesh of another device type (``"cpu"``) does not."""
    if qual in SET_DEVICE:
        return True
    if qual not in DEVICE_MESH:
        return False
    kind = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "device_type"), None)
    return not (isinstance(kind, ast.Constant) and kind.value != "cuda")
DIST_SAMPLERS = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
ITERABLE_DATASETS = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
FABRIC_CLASSES = {"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric",
                  "lightning.fabric.fabric.Fabric", "pytorch_lightning.lite.LightningLite"}
ACCEL_CLASSES = {"accelerate.Accelerator", "accelerate.accelerator.Accelerator"}
BATCHNORMS = {f"torch.nn.{n}" for n in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d",
                                         "LazyBatchNorm2d", "LazyBatchNorm3d")}
BATCHNORMS |= {n.replace("torch.nn.", "torch.nn.modules.batchnorm.") for n in BATCHNORMS}

TORCH_COLLECTIVES = {
    "all_reduce", "reduce", "broadcast", "barrier", "all_gather", "all_gather_object",
    "all_gather_into_tensor", "_all_gather_base", "gather", "gather_object", "scatter",
    "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_to_all", "all_to_all_single", "broadcast_object_list", "monitored_barrier", "new_group",
    "all_reduce_coalesced", "all_gather_coalesced",
}
# torch.distributed.checkpoint: every rank takes part in saving / loading
DCP_COLLECTIVES = {f"torch.distributed.checkpoint.{n}" for n in ("save", "load", "save_state_dict",
                                                                  "load_state_dict", "async_save")}
# position of the `group` argument of torch.distributed's collectives
_GROUP_POS = {"barrier": 0, "monitored_barrier": 0, "all_reduce": 2, "broadcast": 2, "reduce": 3,
              "all_gather": 2, "all_gather_object": 2, "all_gather_into_tensor": 2, "gather": 3,
              "gather_object": 3, "scatter": 3, "scatter_object_list": 3, "reduce_scatter": 3,
              "reduce_scatter_tensor": 3, "all_to_all": 2, "all_to_all_single": 4,
              "broadcast_object_list": 2}
# collectives that write their result into their first argument
INPLACE_COLLECTIVES = {"all_reduce", "broadcast", "reduce", "all_reduce_coalesced"}
# collectives whose first argument is an output every rank receives in full (the same on every rank)
GATHER_OUTPUT_COLLECTIVES = {"all_gather", "all_gather_object", "all_gather_into_tensor", "_all_gather_base",
                             "broadcast_object_list", "all_gather_coalesced"}
FABRIC_COLLECTIVES = {"barrier", "all_reduce", "broadcast", "all_gather", "save"}
ACCEL_COLLECTIVES = {"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"}
ACCEL_FUNCS = {"accelerate.utils." + n for n in ("gather", "broadcast", "reduce", "wait_for_everyone",
                                                  "pad_across_processes", "broadcast_object_list",
                                                  "gather_object")}
STRATEGY_COLLECTIVES = {"barrier", "broadcast", "reduce", "all_gather"}
# ddp_doctor.fixes helpers that run a collective inside (every rank must call them)
FIXES_COLLECTIVES = {"agree", "skip_if_nonfinite", "gather_variable", "rank_zero_first"}
AGREE_FUNCS = {"agree", "all_agree", "any_rank", "all_ranks", "sync_flag"}

_INT_RANK_RE = re.compile(
    r"(?i)^(?:(?:ddp|local|global|node|world|my|cur|current|proc|process|gpu|this|dist)_)?rank(?:_id|_idx|_index)?$"
    r"|^(?:local_)?process_index$|^(?:local_)?rank_?zero_?id$")
_MAIN_NAMES = {
    "is_master", "is_main", "is_main_process", "main_process", "master_process", "is_master_process",
    "is_chief", "is_global_zero", "is_local_zero", "is_rank_zero", "is_rank0", "is_rank_0",
    "is_local_main_process", "is_local_master", "local_master", "is_main_rank", "is_leader",
    "is_world_process_zero", "is_local_process_zero", "rank_zero", "is_zero_rank", "master_rank",
    "is_primary", "is_main_worker",
}
_WORLD_NAMES = {"world_size", "num_processes", "WORLD_SIZE", "ddp_world_size", "nprocs", "num_replicas"}
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK"}
_WORLD_ENV = {"WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS"}
RANK_DECORATORS = {"rank_zero_only", "main_process_only", "on_main_process", "on_local_main_process",
                   "master_only", "rank0_only", "on_rank_zero"}


def is_rank_name(name: str) -> bool:
    return bool(_INT_RANK_RE.match(name))


def is_main_name(name: str) -> bool:
    return name in _MAIN_NAMES


def final_name(node: ast.AST) -> str | None:
    """``a.b.c`` -> ``c``; ``f`` -> ``f``; calls and subscripts -> None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def dotted(node: ast.AST) -> str | None:
    """Source-like dotted text of a Name/Attribute chain (``self.model``), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def kwarg(call: ast.Call, name: str) -> ast.keyword | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def arg_or_kw(call: ast.Call, pos: int, name: str) -> ast.expr | None:
    kw = kwarg(call, name)
    if kw is not None:
        return kw.value
    if len(call.args) > pos and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
        return call.args[pos]
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords)


def const_value(node: ast.AST | None) -> Any:
    """The literal value of a Constant (or -N); a sentinel otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        try:
            return -node.operand.value
        except TypeError:
            return NOTCONST
    return NOTCONST


NOTCONST = object()

# arguments that say *where* a value lives, not *what* it is: the rank in them does not make the
# result differ between ranks (``torch.zeros(3, device=f"cuda:{rank}")``, ``x.to(local_rank)``)
_DEVICE_KWARGS = {"device", "device_ids", "output_device", "map_location", "non_blocking", "device_id"}
_DEVICE_CALLS = {"to", "cuda", "device", "set_device", "pin_memory"}


def is_predicate(node: ast.AST) -> bool:
    """A boolean test: ``rank == 0``, ``local_rank not in [-1, 0]``, ``not is_main``, ``fabric.is_global_zero``."""
    if isinstance(node, (ast.Compare, ast.BoolOp)) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.Call):
        node = node.func
    name = final_name(node)
    return bool(name) and is_main_name(name)


def non_data_args(call: ast.Call) -> list[ast.expr]:
    """Arguments of ``call`` that do not make its result differ between ranks even when they hold the
    rank: device placement (``device=``, ``.to(rank)``, ``torch.device("cuda", rank)``) and rank
    predicates passed as keyword flags (``tqdm(loader, disable=rank != 0)``,
    ``MNIST(root, download=is_main)``, ``verbose=rank == 0``).  A per-rank *value*
    (``batch_size=sizes[rank]``, ``shards[rank]``, ``loader_for(rank)``) is data and not listed."""
    if final_name(call.func) in _DEVICE_CALLS and isinstance(call.func, ast.Attribute):
        return [*call.args, *(k.value for k in call.keywords)]
    return [k.value for k in call.keywords
            if k.arg is not None and (k.arg in _DEVICE_KWARGS or is_predicate(k.value))]


def data_names(node: ast.AST) -> set[str]:
    """The names ``node`` reads, leaving out those only in :func:`non_data_args` positions."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name):
            out.add(n.id)
            continue
        if isinstance(n, _LOCAL_SCOPES) and n is not node:
            out |= data_names(n)  # its own names are local to it: ``[f.name for f in os.scandir(d)]``
            continue
        if n is node and isinstance(n, _LOCAL_SCOPES):
            return _scope_reads(n)
        skip = {id(a) for a in non_data_args(n)} if isinstance(n, ast.Call) else ()
        for ch in ast.iter_child_nodes(n):
            if isinstance(ch, ast.keyword):
                if id(ch.value) not in skip:
                    stack.append(ch.value)
            elif id(ch) not in skip:
                stack.append(ch)
    return out


_LOCAL_SCOPES = (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp, ast.Lambda)


def _scope_reads(n: ast.AST) -> set[str]:
    """What a comprehension or lambda reads from around it: its targets and parameters are its own (a
    comprehension's ``f`` is not the ``f`` of a ``with open(...) as f`` elsewhere in the function)."""
    if isinstance(n, ast.Lambda):
        own = {a.arg for a in ast.walk(n.args) if isinstance(a, ast.arg)}
        return data_names(n.body) - own | {x for d in n.args.defaults + n.args.kw_defaults if d for x in data_names(d)}
    own = {t.id for g in n.generators for t in ast.walk(g.target) if isinstance(t, ast.Name)}
    outer = data_names(n.generators[0].iter)  # the first iterable is read in the enclosing scope
    parts = [n.key, n.value] if isinstance(n, ast.DictComp) else [n.elt]
    parts += [g.iter for g in n.generators[1:]] + [c for g in n.generators for c in g.ifs]
    return outer | {x for p in parts for x in data_names(p)} - own


def alternatives(expr: ast.expr) -> list[ast.expr]:
    """The values a conditional expression may take: ``RandomSampler(ds) if rank == -1 else
    DistributedSampler(ds)`` -> both calls; ``a or b`` -> both."""
    if isinstance(expr, ast.IfExp):
        return alternatives(expr.body) + alternatives(expr.orelse)
    if isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.Or):
        return [x for v in expr.values for x in alternatives(v)]
    return [expr]
