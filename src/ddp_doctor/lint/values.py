"""Value flow: what a name or attribute was assigned, and what kind of object a value is (a DDP
model, a DistributedSampler, a DataLoader, a Fabric / Accelerator, a collective call)."""
from __future__ import annotations

import ast

from ddp_doctor.lint.names import (
    ACCEL_CLASSES, ACCEL_COLLECTIVES, ACCEL_FUNCS, DATALOADERS, DCP_COLLECTIVES, DDP_CLASSES, DIST_SAMPLERS,
    FABRIC_CLASSES, FABRIC_COLLECTIVES, FIXES_COLLECTIVES, FULLY_SHARD, STRATEGY_COLLECTIVES, TORCH_COLLECTIVES,
    _GROUP_POS, alternatives, arg_or_kw, dotted, final_name, kwarg,
)
from ddp_doctor.lint.callargs import CallArgs
from ddp_doctor.lint.scopes import Cond, Scope


class ValueFlow(CallArgs):
    """Mixin of :class:`~ddp_doctor.lint.model.ModuleModel`: assignments and object kinds."""

    def _record_assign(self, scope: Scope, stmt: ast.stmt, conds: tuple[Cond, ...]) -> None:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
            if isinstance(stmt, ast.AugAssign):
                value = ast.BinOp(left=stmt.target, op=stmt.op, right=stmt.value)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            if isinstance(stmt.iter, (ast.List, ast.Tuple)) and stmt.iter.elts and \
                    not any(isinstance(e, ast.Starred) for e in stmt.iter.elts):
                # `for name, loader in [("train", train_loader), ("val", val_loader)]`: each element in turn
                for elt in stmt.iter.elts:
                    self._bind(scope, stmt.target, elt, conds)
                return
            targets, value = [stmt.target], ast.Subscript(value=stmt.iter, slice=ast.Constant(value=0))
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self._bind(scope, item.optional_vars, item.context_expr, conds)
            return
        for t in targets:
            self._bind(scope, t, value, conds)

    def _bind(self, scope: Scope, target: ast.expr, value: ast.expr, conds: tuple[Cond, ...]) -> None:
        if isinstance(target, ast.Name):
            scope.assigns.setdefault(target.id, []).append((value, conds))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                    self._bind(scope, elt, value.elts[i], conds)
                else:
                    sub = ast.Subscript(value=value, slice=ast.Constant(value=i))
                    ast.copy_location(sub, value)
                    self._bind(scope, elt, sub, conds)
        elif isinstance(target, ast.Attribute):
            d = dotted(target)
            if d and d.startswith("self.") and scope.cls is not None:
                self.self_assigns.setdefault(scope.cls, {}).setdefault(d, []).append(value)
                self.value_scope[id(value)] = scope
            if d:
                scope.assigns.setdefault(d, []).append((value, conds))

    def values_of(self, expr: ast.expr, scope: Scope) -> list[ast.expr]:
        """Expressions assigned to a Name / self.attr (in scope, then module / class)."""
        d = dotted(expr)
        if d is None:
            return []
        vals = scope.lookup(d)
        if not vals and d.startswith("self.") and scope.cls is not None:
            vals = self.self_assigns.get(scope.cls, {}).get(d, [])
        return vals

    def reaching_values(self, expr: ast.expr, scope: Scope) -> list[ast.expr]:
        """:meth:`values_of` a name of this scope, less the assignments that come after ``expr`` on a straight
        path (no loop of the scope holds both): ``model(x)`` on rank 0 before ``model = DDP(model)`` calls the
        plain module (llm.c writes its reference tensors so)."""
        vals = self.values_of(expr, scope)
        use = getattr(expr, "lineno", None)
        if not isinstance(expr, ast.Name) or use is None or expr.id not in scope.assigns:
            return vals

        def reaches(v: ast.expr) -> bool:
            line = getattr(v, "lineno", None)
            return line is None or line < use or any(
                loop.lineno <= min(use, line) and max(use, line) <= (loop.end_lineno or loop.lineno)
                for loop, _c, _l in scope.loops)
        return [v for v in vals if reaches(v)]

    def param_args(self, expr: ast.expr, scope: Scope) -> list[tuple[ast.expr, Scope]]:
        """For a parameter ``expr`` of ``scope``'s function: what this file's callers pass for it
        (``prepare_dataloader(dataset, 32)`` -> ``dataset`` in the caller's scope)."""
        if not isinstance(expr, ast.Name) or expr.id not in scope.params or scope.is_module:
            return []
        idx = scope.params.index(expr.id)
        fn = scope.node
        if scope.cls is not None and fn.args.args and fn.args.args[0].arg in ("self", "cls"):
            idx -= 1  # a method's ``self`` is not passed at the call site
        out = []
        for site in self.call_sites_of(fn):
            a = arg_or_kw(site.call, idx, expr.id) if idx >= 0 else None
            if a is not None:
                out.append((a, site.scope))
        return out

    def scope_of_value(self, value: ast.expr, default: Scope) -> Scope:
        """The scope a value returned by :meth:`values_of` must be resolved in (self.attr values live in
        the method that assigned them)."""
        return self.value_scope.get(id(value), default)

    def returned_values(self, expr: ast.expr, scope: Scope) -> list[tuple[ast.expr, Scope]]:
        """The values a call of a same-file function returns (``wrap(model)``), or the element of its
        returned tuple or dict that ``expr`` takes (``build(cfg)[0]`` from ``loader, valset, fn =
        build(cfg)``; ``build(cfg)["train"]``)."""
        index = None
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and \
                type(expr.slice.value) in (int, str):
            index, expr = expr.slice.value, expr.value
        if not isinstance(expr, ast.Call):
            return []
        fn = self.resolve_function(expr.func, scope)
        if fn is None or fn is scope.node:
            return []
        inner = self.scopes[fn]
        out = []
        for r in self.returns_of(fn):
            v = r.value
            if v is not None and isinstance(index, str):  # `return {"train": loader, ...}`
                v = next((x for k, x in zip(v.keys, v.values) if isinstance(k, ast.Constant) and k.value == index),
                         None) if isinstance(v, ast.Dict) else None
            elif v is not None and index is not None:
                ok = isinstance(v, (ast.Tuple, ast.List)) and -len(v.elts) <= index < len(v.elts) and \
                    not any(isinstance(e, ast.Starred) for e in v.elts)
                v = v.elts[index] if ok else None
            if v is not None:
                out.append((v, inner))
        return out

    def call_result_facts(self, expr: ast.expr, scope: Scope) -> dict:
        """What a call of another project file's function returns ("loader", "shuffled_sampler",
        "sampler", "ddp" -> Related): ``model = wrap(model)``; for ``build(cfg)[0]`` (a returned tuple
        unpacked) or ``build(cfg)["train"]`` (a returned dict), what that element holds."""
        index = None
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant) and \
                type(expr.slice.value) in (int, str):
            index, expr = expr.slice.value, expr.value
        if not isinstance(expr, ast.Call) or self.project is None or \
                self.resolve_function(expr.func, scope) is not None:
            return {}
        summ = self.project.summary_of_call(self, expr.func, scope)
        if summ is None:
            return {}
        return summ.returns if index is None else summ.items.get(index, {})

    def is_ddp_call(self, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        q = self.qual(call.func)
        if q in DDP_CLASSES:
            return True
        return q is None and final_name(call.func) in ("DistributedDataParallel",)

    def sharded_in_place(self, expr: ast.expr, scope: Scope) -> bool:
        """``fully_shard(model)`` as a statement of this scope or the module's: ``model`` is sharded in place
        from then on (FSDP2), its forward all-gathers from every rank."""
        name = dotted(expr)
        return name is not None and (name in self._sharded_names(scope) or name in self._sharded_names(self.scope))

    def _sharded_names(self, scope: Scope) -> set[str]:
        key = ("sharded", id(scope.node))
        got = self._cache.get(key)
        if got is None:
            got = self._cache[key] = {
                d for g in scope.sites if isinstance(g.stmt, ast.Expr) and g.stmt.value is g.call and g.call.args
                and final_name(g.call.func) == "fully_shard" and self.qual(g.call.func) in FULLY_SHARD
                and (d := dotted(g.call.args[0])) is not None}
        return got

    def class_def(self, func: ast.expr, scope: Scope):
        """(model, ClassDef) for ``Cls(...)`` / ``Cls.from_pretrained(...)``, in this file or a project file."""
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr[:1].islower():
            func = func.value  # a classmethod constructor: GPT.from_pretrained(...)
        if isinstance(func, ast.Name) and func.id in self.classes:
            return self, self.classes[func.id]
        if self.project is not None:
            got = self.project.resolve_call(self, func, scope)
            if got is not None and isinstance(got[1], ast.ClassDef):
                return got
        return None

    def is_sampler_call(self, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        q = self.qual(call.func)
        if q in DIST_SAMPLERS or (q is None and final_name(call.func) == "DistributedSampler"):
            return True
        if isinstance(call.func, ast.Subscript):  # `SAMPLERS[cfg.sampler](dataset)`: a registry of classes
            return any(self._is_sampler_class(b) for b in self._registry_values(call.func.value, self.scope))
        return isinstance(call.func, ast.Name) and q is None and call.func.id in self._sampler_aliases()

    def _is_sampler_class(self, node: ast.AST) -> bool:
        q = self.qual(node)
        return q in DIST_SAMPLERS or (q is None and final_name(node) == "DistributedSampler")

    def _sampler_aliases(self) -> set[str]:
        """Names bound to the DistributedSampler class itself, possibly in one branch:
        ``train_sampler = RandomSampler if args.local_rank == -1 else DistributedSampler``, or picked from a
        registry of sampler classes: ``SAMPLERS = {"dist": DistributedSampler, ...}``, ``SAMPLERS[name]``."""
        got = self._cache.get("sampler_aliases")
        if got is None:
            got = set()
            for scope in self.scopes.values():
                for name, vals in scope.assigns.items():
                    if "." in name:
                        continue
                    for v, _c in vals:
                        branches = [v.body, v.orelse] if isinstance(v, ast.IfExp) else \
                            v.values if isinstance(v, ast.BoolOp) else \
                            self._registry_values(v.value, scope) if isinstance(v, ast.Subscript) else [v]
                        if any(self._is_sampler_class(b) for b in branches):
                            got.add(name)
            self._cache["sampler_aliases"] = got
        return got

    def _registry_values(self, container: ast.expr, scope: Scope) -> list[ast.expr]:
        """The values of a dict literal (or ``dict(k=v)``) that ``container`` is, or a name bound to one."""
        for c in [container, *(self.values_of(container, scope) if isinstance(container, ast.Name) else ())]:
            if isinstance(c, ast.Dict):
                return [v for v in c.values if v is not None]
            if isinstance(c, ast.Call) and final_name(c.func) == "dict":
                return [k.value for k in c.keywords]
        return []

    def is_dataloader_call(self, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        q = self.qual(call.func)
        if q in DATALOADERS or (q is None and final_name(call.func) == "DataLoader" and "DataLoader" not in self.classes):
            return True
        return isinstance(call.func, ast.Name) and q is None and call.func.id in self._loader_aliases()

    def _is_loader_class(self, node: ast.AST) -> bool:
        q = self.qual(node)
        return q in DATALOADERS or (q is None and final_name(node) == "DataLoader" and "DataLoader" not in self.classes)

    def _loader_aliases(self) -> set[str]:
        """Names of this file that stand for the DataLoader class: its subclasses defined here
        (``class MultiEpochsDataLoader(DataLoader)``) and variables bound to one of them, every binding
        (timm's ``loader_class = torch.utils.data.DataLoader`` ... ``loader_class(dataset, **loader_args)``)."""
        got = self._cache.get("loader_aliases")
        if got is None:
            got = {name for name, cls in self.classes.items() if any(self._is_loader_class(b) for b in cls.bases)}
            for scope in self.scopes.values():
                for name, vals in scope.assigns.items():
                    if "." not in name and all(
                            self._is_loader_class(b) or (isinstance(b, ast.Name) and b.id in got)
                            for v, _c in vals for b in alternatives(v)):
                        got.add(name)
            self._cache["loader_aliases"] = got
        return got

    def _receiver_kind(self, recv: ast.expr, scope: Scope) -> str | None:
        """'fabric' / 'accelerator' / 'strategy' for the objects whose methods are collectives."""
        key = ("recv", id(recv))
        d = dotted(recv)
        if d is None:
            return None
        last = d.split(".")[-1]
        # by name only when the library is imported here (Lightning's own `self.accelerator` is not
        # Hugging Face accelerate's Accelerator)
        if last in ("fabric", "_fabric", "lite") and self._imports_any("lightning", "lightning_fabric",
                                                                        "pytorch_lightning"):
            return "fabric"
        if last in ("accelerator", "_accelerator") and self._imports_any("accelerate"):
            return "accelerator"
        if last == "strategy" and self._imports_any("lightning", "pytorch_lightning"):
            return "strategy"
        for v in self.values_of(recv, scope):
            if isinstance(v, ast.Call):
                q = self.qual(v.func)
                if q in FABRIC_CLASSES:
                    return "fabric"
                if q in ACCEL_CLASSES:
                    return "accelerator"
        del key
        return None

    def _imports_any(self, *roots: str) -> bool:
        key = ("imports_any", roots)
        if key not in self._cache:
            self._cache[key] = any(q.split(".")[0] in roots for q in self.imports.values())
        return self._cache[key]

    def collective_name(self, call: ast.Call, scope: Scope) -> str | None:
        """``dist.barrier`` etc. when ``call`` is a collective every rank of the group must enter."""
        func = call.func
        q = self.qual(func)
        if q:
            if q in DDP_CLASSES:
                return "DistributedDataParallel"  # construction verifies and broadcasts parameters
            if q.startswith("torch.distributed."):
                if q in DCP_COLLECTIVES:
                    return "dcp." + q.rsplit(".", 1)[1]
                op = q.rsplit(".", 1)[1]
                if op in TORCH_COLLECTIVES and q.count(".") <= 3 and not q.startswith("torch.distributed.checkpoint"):
                    if op == "new_group" and _is_true(arg_or_kw(call, 4, "use_local_synchronization")):
                        return None  # entered by the group's members only, by design
                    return f"dist.{op}"
                return None
            if q in ACCEL_FUNCS:
                return "accelerate." + q.rsplit(".", 1)[1]
            if q.startswith("ddp_doctor.fixes.") and q.rsplit(".", 1)[1] in FIXES_COLLECTIVES:
                return "fixes." + q.rsplit(".", 1)[1]
            return None
        if isinstance(func, ast.Attribute):
            kind = self._receiver_kind(func.value, scope)
            if kind == "fabric" and func.attr in FABRIC_COLLECTIVES:
                return f"fabric.{func.attr}"
            if kind == "accelerator" and func.attr in ACCEL_COLLECTIVES:
                return f"accelerator.{func.attr}"
            if kind == "strategy" and func.attr in STRATEGY_COLLECTIVES:
                return f"strategy.{func.attr}"
            if isinstance(func.value, ast.Name) and func.value.id == "self" and self._is_lightning_module(scope.cls):
                if func.attr == "all_gather":
                    return "self.all_gather"
                if func.attr in ("log", "log_dict"):
                    kw = kwarg(call, "sync_dist")
                    if kw is not None and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                        return f"self.{func.attr}(sync_dist=True)"
        return None

    def _is_lightning_module(self, cls: ast.ClassDef | None) -> bool:
        if cls is None:
            return False
        for b in cls.bases:
            name = final_name(b) or ""
            if name in ("LightningModule", "LightningLite") or (self.qual(b) or "").endswith("LightningModule"):
                return True
        return False

    def uses_subgroup(self, call: ast.Call) -> bool:
        """A collective on an explicit process group: legitimately entered by that group's ranks only."""
        q = self.qual(call.func) or ""
        pos = _GROUP_POS.get(q.rsplit(".", 1)[-1]) if q.startswith("torch.distributed.") else None
        g = arg_or_kw(call, pos, "group") if pos is not None else (kwarg(call, "group").value
                                                                    if kwarg(call, "group") else None)
        if g is None:
            return False
        if isinstance(g, ast.Constant) and g.value is None:
            return False
        d = dotted(g) or ""
        return not d.endswith("WORLD")

    def is_backward_call(self, call: ast.Call) -> bool:
        return isinstance(call.func, ast.Attribute) and call.func.attr in ("backward", "manual_backward")

    # ------------------------------------------------------- DDP models
    def _returns_ddp(self, expr: ast.expr, scope: Scope, depth: int) -> bool:
        """``model = wrap(model)``: a helper, here or in another project file, returns the DDP model."""
        if any(self.is_ddp_value(v, vs, depth + 1) for v, vs in self.returned_values(expr, scope)):
            return True
        return "ddp" in self.call_result_facts(expr, scope)

    def is_ddp_value(self, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
        """Does ``expr`` hold a DDP-wrapped model (``model = DDP(net)``, ``model, opt = fabric.setup(...)``)?"""
        if depth > 4:
            return False
        if isinstance(expr, ast.Call):
            if self.is_ddp_call(expr):
                return True
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr in ("setup", "setup_module") and \
                    self._receiver_kind(f.value, scope) == "fabric":
                return True
            return self._returns_ddp(expr, scope, depth)
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
            if self._returns_ddp(expr, scope, depth):
                return True
            inner = expr.value
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                f = inner.func
                kind = self._receiver_kind(f.value, scope)
                if kind == "fabric" and f.attr == "setup" and expr.slice.value == 0:
                    return True
                if kind == "accelerator" and f.attr == "prepare":
                    i = expr.slice.value
                    if isinstance(i, int) and i < len(inner.args):
                        a = inner.args[i]
                        n = (dotted(a) or "").split(".")[-1].lower()
                        return ("model" in n or n in ("net", "network", "module", "ddp")) and \
                            not any(k in n for k in ("optim", "sched", "loader"))
            return False
        if isinstance(expr, (ast.Name, ast.Attribute)):
            if isinstance(expr, ast.Attribute) and expr.attr == "module":
                return False
            if self.sharded_in_place(expr, scope):
                return True
            vals = [v for v in self.reaching_values(expr, scope) if v is not expr]
            if any(self.is_ddp_value(v, scope, depth + 1) for v in vals):
                return True
            # `self.model = model` in a constructor: what the callers pass, here or in another file
            # (`Trainer(DDP(net, ...), loader).fit()` in the launching script)
            # (only for an attribute: a plain parameter's callers ask the helper's summary themselves)
            params = [(v, self.scope_of_value(v, scope)) for v in vals if isinstance(v, ast.Name)] \
                if isinstance(expr, ast.Attribute) else []
            return any(p.id in sc.params and self._ddp_from_callers(p.id, sc, depth) for p, sc in params)
        return False

    def _ddp_from_callers(self, name: str, scope: Scope, depth: int) -> bool:
        """Parameter ``name`` of ``scope``'s function receives a DDP model from a caller of this file or,
        when it has none here, of another project file."""
        fn = scope.node
        key = ("ddp_param", fn, name)
        if key in self._cache:
            return self._cache[key]
        self._cache[key] = False  # recursion guard
        args = getattr(fn, "args", None)
        res = False
        if args is not None and depth < 3 and name in [a.arg for a in (*args.posonlyargs, *args.args)]:
            got = [(a, sc) for a, sc in self.param_args(ast.Name(id=name), scope)]
            if not got and self.project is not None:
                idx = scope.params.index(name)
                if scope.cls is not None and args.args and args.args[0].arg in ("self", "cls"):
                    idx -= 1
                got = self.project.caller_args(self, fn, idx, name) if idx >= 0 else []
            res = any(sc.module.is_ddp_value(a, sc, depth + 1) for a, sc in got[:8])
        self._cache[key] = res
        return res


def _is_true(node: ast.expr | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True
