"""Questions several rules share, answered once per module and cached on the model.

* which loops are training loops (they run a backward, directly or through a helper);
* which DataLoader a loop iterates (through variables, ``enumerate``/``tqdm`` and one
  level of function parameters);
* which same-file functions call a collective or the DDP model (one level deep);
* whether a rank-conditional group of collectives is balanced (every rank enters the
  same number of them, as in the ``local_rank not in [-1, 0]`` / ``local_rank == 0``
  barrier pair of the Hugging Face scripts).
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ddp_doctor.lint.balance import balanced, never_runs, single_process_only  # noqa: F401 (re-exported)
from ddp_doctor.lint.buffers import wrapped_module_has_no_buffers
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import NOTCONST, SHARDING_WRAPPERS, arg_or_kw, const_value, dotted, final_name, kwarg
from ddp_doctor.lint.scopes import Scope, GuardedCall
from ddp_doctor.lint.syntax import dict_items, flag_guard, passes_flag  # noqa: F401 (flag_*: re-exported)

_UNWRAP = {"enumerate", "tqdm", "iter", "zip", "islice", "trange", "track", "progress_bar", "Bar", "chain",
           "cycle", "prefetch", "CUDAPrefetcher", "DataPrefetcher", "data_prefetcher", "MetricLogger", "log_every"}


def _cached(model: ModuleModel, key, fn):
    if key not in model._cache:
        model._cache[key] = fn()
    return model._cache[key]


# ------------------------------------------------------------- helpers ---
def fn_direct_sites(model: ModuleModel, fn: ast.AST) -> list[GuardedCall]:
    return model.scopes[fn].sites if fn in model.scopes else []


def backward_sites(model: ModuleModel, scope: Scope, depth: int = 0) -> list[GuardedCall]:
    """Sites in ``scope`` that run a backward, directly or via a same-file helper (one level)."""
    out = []
    for site in scope.sites:
        if model.is_backward_call(site.call):
            out.append(site)
        elif depth == 0:
            fn = model.resolve_function(site.call.func, scope)
            if fn is not None:
                if fn is not scope.node and any(model.is_backward_call(s.call) for s in fn_direct_sites(model, fn)):
                    out.append(site)
            elif model.project is not None and site.loops and _trains_here(model):
                # train_one_epoch(...) from engine.py, called in a loop of a training script
                summ = model.project.summary_of_call(model, site.call.func, scope)
                if summ is not None and summ.backward is not None or _method_backward(model, site.call, scope):
                    out.append(site)
    return out


def _method_backward(model: ModuleModel, call: ast.Call, scope: Scope):
    """``model.optimize_parameters()`` on an object a project factory or class built (``model =
    create_model(opt)``): where that method runs a backward, if it does."""
    f = call.func
    if not isinstance(f, ast.Attribute) or not isinstance(f.value, ast.Name):
        return None
    for v in model.values_of(f.value, scope):
        got = model.project.resolve_call(model, v.func, scope) if isinstance(v, ast.Call) else None
        if got is not None:
            return model.project.method_backward(got[0], got[1], f.attr)
    return None


def training_loops(model: ModuleModel, scope: Scope) -> list[ast.stmt]:
    """Loops of ``scope`` whose body runs a backward (directly or via a helper call)."""
    def compute():
        loops = []
        bws = backward_sites(model, scope)
        for loop, _c, _l in scope.loops:
            if any(loop in s.loops for s in bws):
                loops.append(loop)
        return loops
    return _cached(model, ("trainloops", scope.node), compute)


def unwrap_iter(expr: ast.expr) -> ast.expr:
    """``enumerate(tqdm(loader))`` -> ``loader``."""
    while isinstance(expr, ast.Call) and final_name(expr.func) in _UNWRAP and expr.args:
        expr = expr.args[0]
    return expr


def resolve_loaders(model: ModuleModel, expr: ast.expr, scope: Scope, depth: int = 0) -> list[tuple[ast.Call, Scope]]:
    """The ``DataLoader(...)`` calls ``expr`` may hold (variables, self attributes, one level of parameters)."""
    if depth > 6:
        return []
    expr = unwrap_iter(expr)
    if isinstance(expr, ast.IfExp):  # tqdm(loader) if rank == 0 else loader
        return resolve_loaders(model, expr.body, scope, depth + 1) + resolve_loaders(model, expr.orelse, scope,
                                                                                      depth + 1)
    if isinstance(expr, ast.Call):
        if model.is_dataloader_call(expr):
            return [(expr, scope)]
        fn = model.resolve_function(expr.func, scope)  # loader = build_loader(ds)
        if fn is not None and fn is not scope.node:
            inner = model.scopes[fn]
            out = []
            for r in model.returns_of(fn):
                if r.value is not None:
                    out += resolve_loaders(model, r.value, inner, depth + 1)
            for arg in _generator_sources(model, expr, fn):  # batches = forever(loader)
                out += resolve_loaders(model, arg, scope, depth + 1)
            return out
        return []
    if isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Call):
        # train_loader, valset, collate_fn = build(cfg): an element of the tuple a helper returns
        return [x for v, vs in model.returned_values(expr, scope) for x in resolve_loaders(model, v, vs, depth + 1)]
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Name):
        # loaders[phase] with `for phase in ["train", "val"]`: each key the name takes
        keys = model.values_of(expr.slice, scope)
        if keys and all(isinstance(k, ast.Constant) for k in keys):
            return [x for k in keys for x in resolve_loaders(
                model, ast.Subscript(value=expr.value, slice=k), scope, depth + 1)]
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        # loaders["train"] with loaders = {"train": DataLoader(...)} or dict(train=DataLoader(...)), and
        # loaders[0] with loaders = [train_loader, val_loader]
        if isinstance(expr.value, (ast.List, ast.Tuple)):
            return [x for item in dict_items(expr.value, expr.slice.value)
                    for x in resolve_loaders(model, item, scope, depth + 1)]
        out = []
        for v in model.values_of(expr.value, scope):
            for item in dict_items(v, expr.slice.value):
                out += resolve_loaders(model, item, model.scope_of_value(v, scope), depth + 1)
            if isinstance(v, ast.Call):  # loaders = build_loaders(cfg); loaders["train"]
                sub = ast.Subscript(value=v, slice=expr.slice)
                for r, rs in model.returned_values(sub, scope):
                    out += resolve_loaders(model, r, rs, depth + 1)
        return out
    d = dotted(expr)
    if d is None:
        return []
    out: list[tuple[ast.Call, Scope]] = []
    for v in model.values_of(expr, scope):
        if v is not expr:
            out += resolve_loaders(model, v, model.scope_of_value(v, scope), depth + 1)
    if not out:
        for a, ascope in model.param_args(expr, scope):
            out += resolve_loaders(model, a, ascope, depth + 1)
    return out


@dataclass
class LoaderUse:
    loader: ast.Call  # the DataLoader(...) call
    loader_scope: Scope
    loop: ast.stmt  # the loop iterating it
    scope: Scope  # scope of the loop
    training: bool  # the loop runs a backward
    epochs: bool  # iterated again and again (nested in an outer loop, or its function is called in a loop)
    via: object = None  # Related: the loop in another project file, when the loader is passed to it
    sets_epoch: bool = False  # that other file's function (or class) calls `set_epoch()` itself
    # the loop is a caller's, in another file, over what a factory of this file returns (DDP102 reports
    # those at the caller's call, which brings the loader in)
    returned: bool = False


def loader_uses(model: ModuleModel) -> list[LoaderUse]:
    def compute():
        uses = []
        for scope in model.scopes.values():
            tl = training_loops(model, scope)
            for loop, _conds, outer in scope.loops:
                if not isinstance(loop, (ast.For, ast.AsyncFor)):
                    continue
                for call, lscope in resolve_loaders(model, loop.iter, scope):
                    epochs = bool(outer) or _called_in_loop(model, scope)
                    uses.append(LoaderUse(call, lscope, loop, scope, loop in tl, epochs))
            for site in scope.sites:  # it = iter(loader) ... next(it) inside a loop
                if final_name(site.call.func) == "next" and site.call.args and site.loops:
                    loop = site.loops[-1]
                    for call, lscope in resolve_loaders(model, site.call.args[0], scope):
                        epochs = len(site.loops) > 1 or _called_in_loop(model, scope) or \
                            _endless(model, site.call.args[0], scope)
                        uses.append(LoaderUse(call, lscope, loop, scope, loop in tl, epochs))
            if model.project is not None and _makes_loaders(model):
                uses.extend(_uses_in_other_files(model, scope))
        return uses
    return _cached(model, "loader_uses", compute)


def _generator_sources(model: ModuleModel, call: ast.Call, fn: ast.AST) -> list[ast.expr]:
    """The arguments of ``call`` that generator ``fn`` loops over and yields from (``def forever(loader):
    while True: for b in loader: yield b``)."""
    if not _is_generator(model, fn):
        return []
    inner = model.scopes[fn]
    offset = 1 if inner.cls is not None and fn.args.args and fn.args.args[0].arg in ("self", "cls") else 0
    out = []
    for loop, _c, _o in inner.loops:
        it = unwrap_iter(loop.iter) if isinstance(loop, (ast.For, ast.AsyncFor)) else None
        if isinstance(it, ast.Name) and it.id in inner.params:
            a = arg_or_kw(call, inner.params.index(it.id) - offset, it.id)
            if a is not None:
                out.append(a)
    return out


def _is_generator(model: ModuleModel, fn: ast.AST) -> bool:
    return _cached(model, ("generator", fn), lambda: any(isinstance(n, (ast.Yield, ast.YieldFrom))
                                                          for n in ast.walk(fn)))


def _endless(model: ModuleModel, expr: ast.expr, scope: Scope) -> bool:
    """``batches = sample_data(loader)`` with ``def sample_data(loader): while True: for b in loader:
    yield b``: an endless generator walks the loader again and again (one pass per epoch)."""
    for v in model.values_of(expr, scope):
        fn = model.resolve_function(v.func, scope) if isinstance(v, ast.Call) else None
        inner = model.scopes.get(fn) if fn is not None else None
        if inner is not None and any(outer for _l, _c, outer in inner.loops) and _is_generator(model, fn):
            return True
    return False


def _trains_here(model: ModuleModel) -> bool:
    """A module that wraps a model for DDP or builds loaders: where a call into another file's
    training function makes a training loop."""
    return model.uses_ddp or _makes_loaders(model)


def _makes_loaders(model: ModuleModel) -> bool:
    def compute():
        return any(model.is_dataloader_call(s.call) for sc in model.scopes.values() for s in sc.sites)
    return _cached(model, "makes_loaders", compute)


def _uses_in_other_files(model: ModuleModel, scope: Scope) -> list[LoaderUse]:
    """``train_one_epoch(model, data_loader, ...)`` with the loop over ``data_loader`` in engine.py."""
    out = []
    for site in scope.sites:
        if model.resolve_function(site.call.func, scope) is not None:
            continue
        if not site.call.args and not site.call.keywords:
            continue
        summ = model.project.summary_of_call(model, site.call.func, scope)
        if summ is None or not summ.iterates:
            continue
        for i, pname in enumerate(summ.params):
            if pname not in summ.iterates:
                continue
            arg = arg_or_kw(site.call, i, pname)
            if arg is None:
                continue
            related, training = summ.iterates[pname]
            for call, lscope in resolve_loaders(model, arg, scope):
                epochs = bool(site.loops) or _called_in_loop(model, scope) or pname in summ.iterated_over_epochs
                out.append(LoaderUse(call, lscope, site.stmt, scope, training, epochs, related, summ.sets_epoch))
    return out


def returned_loader_uses(model: ModuleModel, loader: ast.Call, scope: Scope) -> list[LoaderUse]:
    """The uses of ``loader`` (a DataLoader call of ``scope``) in the callers of other files, when
    ``scope``'s function returns it (see :func:`_uses_by_callers`).  Asked per loader, by the rules that
    would report it (finding the callers costs: they are parsed)."""
    if model.project is None:
        return []
    uses = _cached(model, ("returned_uses", scope.node), lambda: _uses_by_callers(model, scope))
    return [u for u in uses if u.loader is loader]


def _uses_by_callers(model: ModuleModel, scope: Scope) -> list[LoaderUse]:
    """``loader, sampler = build_loader(...)`` in another project file that walks the loader in its training
    loop: the uses of the loaders a factory function of this file returns (alone, in a tuple or a dict)."""
    from ddp_doctor.lint.function_summary import Related

    fn = scope.node
    if scope.is_module or model.def_parent.get(fn) is not model.tree:
        return []
    made = []
    for r in model.returns_of(fn):
        v = r.value
        parts = v.elts if isinstance(v, (ast.Tuple, ast.List)) else v.values if isinstance(v, ast.Dict) else [v]
        for part in parts:
            if part is not None:
                made += resolve_loaders(model, part, scope)
    if not made:
        return []
    out = []
    for caller in model.project.callers_of(model, fn):
        cm, site = caller.model, caller.site
        cs = site.scope
        training = training_loops(cm, cs)
        for loop, _conds, outer in cs.loops:
            if not isinstance(loop, (ast.For, ast.AsyncFor)) or not _flows_from(cm, loop.iter, cs, site.call):
                continue
            epochs = bool(outer) or _called_in_loop(cm, cs)
            via = Related(cm.path, loop.lineno, f"the loop over what `{getattr(fn, 'name', '?')}()` returns")
            for call, lscope in made:
                out.append(LoaderUse(call, lscope, loop, cs, loop in training, epochs, via, returned=True))
    return out


def _flows_from(model: ModuleModel, expr: ast.expr, scope: Scope, call: ast.Call, depth: int = 0) -> bool:
    """``expr`` holds what ``call`` returned, or an element of it (through names, tuple unpacking, keys)."""
    if depth > 4:
        return False
    expr = unwrap_iter(expr)
    if any(n is call for n in ast.walk(expr)):
        return True
    names = [n for n in ast.walk(expr) if isinstance(n, (ast.Name, ast.Attribute))][:4]
    return any(_flows_from(model, v, scope, call, depth + 1)
               for n in names for v in model.values_of(n, scope)[:4] if v is not expr)


def _called_in_loop(model: ModuleModel, scope: Scope) -> bool:
    if scope.is_module:
        return False
    return any(site.loops for site in model.call_sites_of(scope.node))


def loader_passed_to_wrapper(model: ModuleModel, call: ast.Call, scope: Scope) -> bool:
    """The loader goes through ``fabric.setup_dataloaders`` / ``accelerator.prepare`` (they add a sampler)."""
    names = set()
    for s in model.scopes.values():
        for n, vals in s.assigns.items():
            if any(v is call for v, _ in vals):
                names.add(n)
    for s in model.scopes.values():
        for site in s.sites:
            f = site.call.func
            if isinstance(f, ast.Attribute) and f.attr in ("setup_dataloaders", "prepare", "prepare_data_loader",
                                                           "setup_dataloader"):
                for a in site.call.args:
                    if a is call or dotted(a) in names:
                        return True
    return False


# --------------------------------------------------------- collectives ---
def fn_collectives(model: ModuleModel, fn: ast.AST, depth: int = 0) -> list[tuple[str, ast.Call]]:
    """Collectives ``fn`` enters on every rank it runs on (not themselves rank-guarded inside it)."""
    key = ("fncoll", fn, depth)
    if key in model._cache:
        return model._cache[key]
    model._cache[key] = []  # recursion guard
    scope = model.scopes.get(fn)
    out: list[tuple[str, ast.Call]] = []
    if scope is not None and not scope.rank_guarded_all:
        for site in scope.sites:
            # what the site would add first, its (costly) rank conditions only when that is something
            name = model.collective_name(site.call, scope)
            if name and not model.uses_subgroup(site.call):
                got = [(name, site.call)]
            elif depth < 1:
                callee = model.resolve_function(site.call.func, scope)
                got = fn_collectives(model, callee, depth + 1) if callee is not None and callee is not fn else []
            else:
                got = []
            if got and flag_guard(fn, site.conds) is None and not model.rank_conds(site.conds, scope):
                out += got
    model._cache[key] = out
    return out


def fn_flagged_collectives(model: ModuleModel, fn: ast.AST) -> list[tuple[str, str, ast.Call]]:
    """Collectives of ``fn`` entered only when a flag parameter that is off by default is passed on:
    ``(param, name, call)`` for ``if use_distributed_barriers: dist.barrier()`` with ``=False``."""
    scope = model.scopes.get(fn)
    out = []
    for site in scope.sites if scope is not None and not scope.rank_guarded_all else ():
        name = model.collective_name(site.call, scope)
        flag = flag_guard(fn, site.conds) if name and not model.uses_subgroup(site.call) else None
        if flag is not None and not model.rank_conds(site.conds, scope):
            out.append((flag, name, site.call))
    return out


def ddp_forward_in_fn(model: ModuleModel, fn: ast.AST, call: ast.Call, caller: Scope) -> ast.Call | None:
    """The DDP-model call inside helper ``fn`` when called as ``call`` from ``caller``, if any."""
    scope = model.scopes.get(fn)
    if scope is None:
        return None
    offset = 1 if scope.cls is not None and fn.args.args and fn.args.args[0].arg in ("self", "cls") else 0
    pairs = [(scope, s) for s in scope.sites] + [(c, s) for c in _closures(model, fn, scope) for s in c.sites]
    for inner, site in pairs:
        target = forward_target(site.call)
        if target is None or model.rank_conds(site.conds, inner):
            continue
        if inner is not scope and not (isinstance(target, ast.Name) and target.id not in inner.params and
                                       target.id not in inner.assigns):
            continue  # in a closure, only the helper's own parameter (a free variable there) is followed
        def quiet(inner=inner, site=site) -> bool:
            return in_no_grad(model, inner, site.call.lineno) or in_no_grad(model, scope, site.call.lineno) or \
                in_no_grad(model, caller, call.lineno)
        if isinstance(target, ast.Name) and target.id in scope.params:
            idx = scope.params.index(target.id) - offset
            a = arg_or_kw(call, idx, target.id) if idx >= 0 else None
            if a is not None and model.is_ddp_value(a, caller):
                if no_buffer_broadcast(model, a, caller) and quiet():
                    continue
                return site.call
        elif model.is_ddp_value(target, scope):
            if no_buffer_broadcast(model, target, scope) and quiet():
                continue
            return site.call
    return None


def _closures(model: ModuleModel, fn: ast.AST, scope: Scope) -> list[Scope]:
    """The functions defined inside ``fn`` and called there (pytorch/examples' ``validate`` runs its loop in
    a nested ``run_validate(loader)``): what they do, ``fn`` does."""
    def compute() -> list:
        nested = [n for n in ast.walk(fn) if n is not fn and isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
        if not nested:
            return []
        called = {final_name(s.call.func) for s in scope.sites}
        return [model.scopes[n] for n in nested if n in model.scopes and n.name in called]
    return _cached(model, ("closures", id(fn)), compute)


def forward_target(call: ast.Call) -> ast.expr | None:
    """``model(x)`` -> ``model``; ``model.forward(x)`` -> ``model``; else None."""
    f = call.func
    if isinstance(f, ast.Attribute) and f.attr == "forward":
        return f.value
    if isinstance(f, (ast.Name, ast.Attribute)):
        return f
    return None


def ddp_constructions(model: ModuleModel, expr: ast.expr, scope: Scope, depth: int = 0) -> list[ast.Call]:
    if depth > 4:
        return []
    if isinstance(expr, ast.Call):
        return [expr] if model.is_ddp_call(expr) else []
    out = []
    for v in model.values_of(expr, scope):
        if v is not expr:
            out += ddp_constructions(model, v, scope, depth + 1)
    return out


def sharded(model: ModuleModel, expr: ast.expr, scope: Scope) -> bool:
    """``expr`` is an FSDP / FSDP2 model: sharded in place by ``fully_shard``, or built by a sharding wrapper."""
    return model.sharded_in_place(expr, scope) or any(model.qual(c.func) in SHARDING_WRAPPERS
                                                      for c in ddp_constructions(model, expr, scope))


def no_buffer_broadcast(model: ModuleModel, expr: ast.expr, scope: Scope) -> bool:
    """A forward of the DDP model ``expr`` broadcasts no buffers: every DDP construction behind it says
    ``broadcast_buffers=False``, or the module it wraps is shown to have no buffers (see lint.buffers)."""
    if sharded(model, expr, scope):
        return False  # FSDP / FSDP2 forwards all-gather parameters whatever the grad mode or buffers
    calls = ddp_constructions(model, expr, scope)
    if bool(calls) and all(kwarg(c, "broadcast_buffers") is not None and
                           literal(kwarg(c, "broadcast_buffers").value) is False for c in calls):
        return True
    return wrapped_module_has_no_buffers(model, calls, scope)


_NO_GRAD = ("no_grad", "inference_mode")


def in_no_grad(model: ModuleModel, scope: Scope, line: int) -> bool:
    """``line`` runs under ``torch.no_grad()`` / ``inference_mode()`` (decorator or ``with``)."""
    key = ("nograd", scope.node)
    spans = model._cache.get(key)
    if spans is None:
        spans = []
        node = scope.node
        if not scope.is_module:
            for d in node.decorator_list:
                if final_name(d.func if isinstance(d, ast.Call) else d) in _NO_GRAD:
                    spans.append((0, 1 << 30))
        for stmt, _c, _l in scope.stmts:
            if isinstance(stmt, (ast.With, ast.AsyncWith)):
                for item in stmt.items:
                    e = item.context_expr
                    if final_name(e.func if isinstance(e, ast.Call) else e) in _NO_GRAD:
                        spans.append((stmt.lineno, stmt.end_lineno or stmt.lineno))
        model._cache[key] = spans
    return any(a <= line <= b for a, b in spans)


def literal(node):
    v = const_value(node)
    return None if v is NOTCONST else v


__all__ = [
    "ModuleModel", "loader_uses", "training_loops", "resolve_loaders", "fn_collectives", "ddp_forward_in_fn",
    "balanced", "never_runs", "backward_sites", "forward_target", "loader_passed_to_wrapper", "literal",
    "in_no_grad", "no_buffer_broadcast", "single_process_only",
]
