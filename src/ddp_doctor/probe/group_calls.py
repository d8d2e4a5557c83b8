"""Process groups as the probe records them: the key of a group a collective runs on (:func:`group_key`),
and group creation — which torch APIs create groups on every rank and which of their arguments every rank
must agree on.

``new_group`` (and ``new_subgroups``, ``new_subgroups_by_enumeration``, ``init_device_mesh``, which call
it) must be entered by every rank of the job, in the same order, with the same arguments: torch names
each group by a counter of these calls, so a rank that calls it with other ranks, or once more, pairs
the wrong groups and hangs in their set-up.  The hooks record each call under
:data:`~ddp_doctor.evidence.GROUP_CREATION`, its arguments as the fingerprint's "shapes", so a
disagreement is proven the moment both ranks have made the call.

``new_group(use_local_synchronization=True)`` is entered by the group's members only: it is not a
call every rank makes and is not recorded (a description of None).
"""
from __future__ import annotations

import importlib
import inspect
import sys
import weakref
from typing import Any, Callable

_group_keys: dict[int, tuple] = {}  # id(group) -> (weak reference, key)
mesh_dims: dict[str, str] = {}  # group key -> the DeviceMesh dimension it is ("tp"), from torch's group_desc


def group_key(group) -> str | None:
    """The group's key, "world" or "pg:0,1" (its global ranks; "pg:0,1~1" for the second group of the same
    ranks, by creation order, which every member shares: Megatron-style NCCL and gloo twins of one group
    keep sequences of their own); None for a group this rank is not in
    (torch's NON_GROUP_MEMBER, an int, whose get_process_group_ranks() answers with the last such group's
    ranks): the call is a no-op there, and recording it would pair it with the members' real calls.
    Cached by id() with a weak reference, so a group created where a destroyed one lived is asked anew."""
    if group is None:
        return "world"
    if isinstance(group, int):
        return None
    cached = _group_keys.get(id(group))
    if cached is not None and cached[0]() is group:
        return cached[1]
    try:
        from torch.distributed import distributed_c10d as c10d

        if group is c10d.GroupMember.WORLD or group is c10d._get_default_group():
            key = "world"
        else:
            ranks = c10d.get_process_group_ranks(group)
            key = "pg:" + ",".join(str(r) for r in ranks) + _twin_suffix(c10d, group, set(ranks))
            desc = getattr(group, "group_desc", "") or ""
            if desc.startswith("mesh_") and desc != "mesh_default":  # init_device_mesh's f"mesh_{dim_name}"
                mesh_dims[key] = desc[len("mesh_"):]
    except Exception:
        key = "pg?"
    try:
        _group_keys[id(group)] = (weakref.ref(group), key)
    except TypeError:  # not weakly referenceable: ask every time
        pass
    return key


def _twin_suffix(c10d, group, ranks: set[int]) -> str:
    """"~N" for the N-th (N >= 1) group created with these same ranks (torch's registry is in creation order)."""
    try:
        same = [pg for pg, members in list(c10d._world.pg_group_ranks.items())
                if set(members) == ranks and pg is not c10d._get_default_group()]
    except Exception:
        return ""
    n = next((i for i, pg in enumerate(same) if pg is group), 0)
    return f"~{n}" if n else ""


def _ranks_text(ranks) -> str:
    return "[" + ", ".join(map(str, ranks)) + "]"


def _world() -> int | None:
    try:
        import torch.distributed as dist

        return dist.get_world_size()
    except Exception:
        return None


def _new_group(a: dict[str, Any]) -> tuple[str, ...] | None:
    if a.get("use_local_synchronization"):
        return None
    ranks = a.get("ranks")
    if ranks is None:  # every rank: the same group as the full list
        world = _world()
        text = "all" if world is None else _ranks_text(range(world))
    else:
        ranks = [int(r) for r in ranks]
        text = _ranks_text(sorted(ranks) if a.get("sort_ranks", True) else ranks)
    out = [f"ranks={text}"]
    if a.get("backend") is not None:
        out.append(f"backend={a['backend']}")
    return tuple(out)


def _new_subgroups(a: dict[str, Any]) -> tuple[str, ...]:
    out = [f"group_size={a.get('group_size')}"]
    if a.get("group") is not None:
        out.append("of a subgroup")  # every rank of the job still enters it
    return tuple(out)


def _by_enumeration(a: dict[str, Any]) -> tuple[str, ...]:
    groups = a.get("ranks_per_subgroup_list") or []
    return ("ranks=[" + ", ".join(_ranks_text(g) for g in groups) + "]",)


def _device_mesh(a: dict[str, Any]) -> tuple[str, ...]:
    # (mesh_dim_names are this rank's own labels: different names make the same groups)
    return str(a.get("device_type")), f"mesh_shape={tuple(a.get('mesh_shape') or ())}"


# (module, function, description of its arguments)
CREATORS: tuple[tuple[str, str, Callable[[dict[str, Any]], "tuple[str, ...] | None"]], ...] = (
    ("torch.distributed.distributed_c10d", "new_group", _new_group),
    ("torch.distributed.distributed_c10d", "new_subgroups", _new_subgroups),
    ("torch.distributed.distributed_c10d", "new_subgroups_by_enumeration", _by_enumeration),
    ("torch.distributed.device_mesh", "init_device_mesh", _device_mesh),
)


def describer(fn, describe: Callable[[dict[str, Any]], "tuple[str, ...] | None"]):
    """(args, kwargs) of a call of ``fn`` -> the arguments every rank must agree on, or None (not recorded)."""
    sig = inspect.signature(fn)

    def described(args: tuple, kwargs: dict) -> tuple[str, ...] | None:
        return describe(sig.bind_partial(*args, **kwargs).arguments)

    return described


def patch(wrap) -> None:
    """Replace each creator (and its ``torch.distributed`` alias) by ``wrap(fn, name, describe)``."""
    for module, name, describe in CREATORS:
        mod = importlib.import_module(module)
        fn = getattr(mod, name, None)
        if fn is None or hasattr(fn, "__ddp_doctor_wrapped__"):
            continue
        wrapped = wrap(fn, name, describer(fn, describe))
        setattr(mod, name, wrapped)
        dist = sys.modules.get("torch.distributed")
        if getattr(dist, name, None) is fn:
            setattr(dist, name, wrapped)
