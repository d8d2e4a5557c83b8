"""Does a DDP-wrapped module have buffers?  A forward under ``no_grad`` runs no collective unless DDP
broadcasts buffers (``broadcast_buffers=True``, the default, *and* the module has buffers: BatchNorm
running statistics, ``register_buffer``).  So evaluating the DDP model on rank 0 only is a hang when
the model has buffers, and harmless when it provably has none on the code path it runs.

The module's class is read in this file or, through the project, in another one (nanoGPT's ``GPT``
in ``model.py``), with the classes it builds in ``__init__``.  A buffer registered only under a
condition (nanoGPT registers its causal mask only ``if not self.flash``, a fallback for old torch)
is not proof of one; an unconditional ``register_buffer``, a BatchNorm/InstanceNorm layer, or any
class that cannot be read (``torchvision.models.resnet50``, ``timm.create_model``) keeps the finding.
"""
from __future__ import annotations

import ast
import builtins
from typing import TYPE_CHECKING

from ddp_doctor.lint.names import final_name

if TYPE_CHECKING:
    from ddp_doctor.lint.model import ModuleModel
    from ddp_doctor.lint.scopes import Scope

_BUFFERED = ("BatchNorm", "SyncBatchNorm", "InstanceNorm", "RunningStat")
_BUILTINS = set(vars(builtins))
_WRAPPERS = {"compile", "to", "cuda", "half", "float", "bfloat16", "train", "eval", "convert_sync_batchnorm"}


def wrapped_module_has_no_buffers(m: "ModuleModel", ddp_calls: list[ast.Call], scope: "Scope") -> bool:
    """True when every module wrapped by ``ddp_calls`` is shown to have no buffer on its main path."""
    if not ddp_calls:
        return False
    for call in ddp_calls:
        inner = call.args[0] if call.args else None
        if inner is None or not _no_buffers(m, inner, scope, 0, set()):
            return False
    return True


def _no_buffers(m: "ModuleModel", expr: ast.expr, scope: "Scope", depth: int, seen: set) -> bool:
    if depth > 6:
        return False
    if isinstance(expr, ast.Call):
        name = final_name(expr.func)
        if name in _WRAPPERS:  # torch.compile(model), model.to(device)
            target = expr.args[0] if name == "compile" and expr.args else \
                expr.func.value if isinstance(expr.func, ast.Attribute) else None
            return target is not None and _no_buffers(m, target, scope, depth + 1, seen)
        if (m.qual(expr.func) or "").startswith("torch."):  # nn.Sequential(nn.Linear(...), nn.LayerNorm(...))
            if any(b in (name or "") for b in _BUFFERED):
                return False
            if name in ("Sequential", "ModuleList", "ModuleDict"):
                parts = [a for a in expr.args if not isinstance(a, ast.Starred)]
                if len(parts) != len(expr.args):
                    return False
                items = [e for a in parts for e in (a.elts if isinstance(a, (ast.List, ast.Tuple)) else [a])]
                return all(_no_buffers(m, e, scope, depth + 1, seen) for e in items)
            return True  # torch layers other than the norm layers above hold parameters only
        cls = m.class_def(expr.func, scope)
        if cls is None:
            return False
        owner, node = cls
        return _class_has_no_buffers(owner, node, depth + 1, seen)
    key = (ast.dump(expr), id(scope))
    if key in seen:
        return True  # `model = torch.compile(model)`: the cycle adds no other value
    seen.add(key)
    vals = [v for v in m.values_of(expr, scope) if v is not expr and not m.is_ddp_call(v)]
    return bool(vals) and all(_no_buffers(m, v, m.scope_of_value(v, scope), depth + 1, seen) for v in vals)


def _class_has_no_buffers(m: "ModuleModel", cls: ast.ClassDef, depth: int, seen: set) -> bool:
    if id(cls) in seen:
        return True
    seen.add(id(cls))
    if depth > 6:
        return False
    for base in cls.bases:  # a project base class contributes its own layers
        got = m.class_def(base, m.scope)
        if got is not None and not _class_has_no_buffers(got[0], got[1], depth + 1, seen):
            return False
    methods = m.methods.get(cls, {})
    init = methods.get("__init__")
    built = [init] if init is not None else []
    if init is not None:  # and the methods __init__ calls to build layers (self._build_blocks())
        for site in m.scopes[init].sites:
            f = site.call.func
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" and \
                    f.attr in methods and methods[f.attr] is not init:
                built.append(methods[f.attr])
    for method in built:
        mscope = m.scopes.get(method)
        if mscope is None:
            continue
        for site in mscope.sites:
            call = site.call
            name = final_name(call.func) or ""
            if name == "register_buffer":
                if not site.conds:
                    return False  # an unconditional buffer
                continue
            if any(b in name for b in _BUFFERED):
                return False
            if not name[:1].isupper() or name in _BUILTINS:
                continue  # a function call or an exception, not a layer
            q = m.qual(call.func) or ""
            if q.startswith("torch."):
                continue  # torch layers other than the norm layers above hold parameters only
            got = m.class_def(call.func, mscope)
            if got is None:
                if name in m.classes or name in ("ModuleList", "ModuleDict", "Sequential", "Parameter"):
                    continue
                return False  # a class we cannot read
            if not _class_has_no_buffers(got[0], got[1], depth + 1, seen):
                return False
    return True
