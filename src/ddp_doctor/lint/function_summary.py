"""Per-function summaries for the cross-file layer (:mod:`ddp_doctor.lint.project`): what one function
does as its callers in other files need to know (collectives, backward, training loop, forwards and
loops over its parameters, what it returns, an early return on data), and the places in other files
(:class:`Related`) that make a finding one."""
from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ddp_doctor.lint.evaluate import RANKS, _Eval
from ddp_doctor.lint.names import arg_or_kw, dotted, final_name, sets_current_device
from ddp_doctor.lint.scopes import Scope

if TYPE_CHECKING:
    from ddp_doctor.lint.model import ModuleModel
    from ddp_doctor.lint.project import Project

@dataclass(frozen=True)
class Related:
    """A place in another file that makes a finding one (SARIF ``relatedLocations``)."""

    path: str
    line: int
    message: str

    @property
    def where(self) -> str:
        return f"{display_path(self.path)}:{self.line}"

    def to_dict(self) -> dict:
        return {"path": display_path(self.path), "line": self.line, "message": self.message}


def display_path(path: str) -> str:
    """``path`` relative to the working directory when it is under it (as the linted paths are shown)."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel


@dataclass
class FunctionSummary:
    """What one function does, as its callers in other files need to know."""

    path: str
    name: str
    params: tuple[str, ...]  # positional parameters, without self/cls
    collectives: tuple[Related, ...] = ()  # entered on every rank that runs the function
    # entered only when a flag parameter, off by default, is passed on: (param, where)
    flagged_collectives: tuple[tuple[str, Related], ...] = ()
    backward: Related | None = None  # runs a backward (itself or through what it calls)
    trains: Related | None = None  # a loop over data with a backward inside (a train-one-epoch function)
    forwards: dict[str, tuple[Related, bool]] = field(default_factory=dict)  # param -> (its call, under no_grad)
    iterates: dict[str, tuple[Related, bool]] = field(default_factory=dict)  # param -> (its loop, with a backward)
    returns: dict[str, Related] = field(default_factory=dict)  # "loader" / "sampler" / "ddp" -> where made
    # the same, per element of a returned tuple (by position) or dict literal (by key)
    items: dict[int | str, dict[str, Related]] = field(default_factory=dict)
    rank_value: str | None = None  # "rank" (returns the rank) or "main" (returns rank == 0)
    # a `return` before the function's backward under a condition that can differ between ranks (its
    # batch, loss, clock, the rank): a caller's training loop then skips the backward on some ranks only
    early_return: Related | None = None
    early_return_on: tuple[str, ...] = ()  # the parameters its condition depends on
    iterated_over_epochs: frozenset[str] = frozenset()  # parameters iterated again and again inside
    sets_epoch: bool = False  # calls some `set_epoch()` (for a constructor: in a method of its class)
    inits_group: Related | None = None  # sets up the process group (`init_process_group`), here or below
    sets_device: Related | None = None  # calls `torch.cuda.set_device` (or enters `torch.cuda.device`), here or below
    saves: Related | None = None  # a `torch.save` it reaches on every rank that runs it (one shared path)


def summarise(project: Project, m: "ModuleModel", fn: ast.AST) -> FunctionSummary:
    from ddp_doctor.lint import analysis as A

    scope = m.scopes[fn]
    params = list(scope.params)
    a = fn.args
    positional = [x.arg for x in (*a.posonlyargs, *a.args)]
    if scope.cls is not None and positional and positional[0] in ("self", "cls"):
        positional = positional[1:]
    s = FunctionSummary(m.path, fn.name, tuple(positional))
    colls: list[Related] = []
    if not scope.rank_guarded_all:
        for name, call in A.fn_collectives(m, fn):
            colls.append(Related(m.path, call.lineno, f"`{name}()` in `{fn.name}`"))
        s.flagged_collectives = tuple((flag, Related(m.path, call.lineno, f"`{name}()` in `{fn.name}`"))
                                      for flag, name, call in A.fn_flagged_collectives(m, fn))
    for site in scope.sites:
        call = site.call
        guarded = None  # the rank conditions are costly: only worked out where they matter

        def is_guarded(site=site) -> bool:
            return scope.rank_guarded_all or bool(m.rank_conds(site.conds, scope))

        if m.is_backward_call(call) and s.backward is None:
            s.backward = Related(m.path, call.lineno, f"the backward in `{fn.name}`")
        if s.inits_group is None and (m.qual(call.func) or "").endswith("init_process_group"):
            s.inits_group = Related(m.path, call.lineno, f"`{fn.name}` sets up the process group")
        if s.sets_device is None and sets_current_device(m.qual(call.func), call):
            s.sets_device = Related(m.path, call.lineno, f"`{fn.name}` sets the CUDA device")
        if s.saves is None and m.qual(call.func) == "torch.save" and not is_guarded() and \
                not ((path := arg_or_kw(call, 1, "f")) is not None and m.mentions_rank(path, scope)):
            s.saves = Related(m.path, call.lineno, f"the `torch.save` in `{fn.name}`")
        target = A.forward_target(call)
        if isinstance(target, ast.Name) and target.id in params and target.id not in s.forwards and \
                not (guarded := is_guarded()):
            quiet = A.in_no_grad(m, scope, call.lineno)
            s.forwards[target.id] = (Related(m.path, call.lineno, f"`{target.id}(...)` in `{fn.name}`"), quiet)
        elif isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and \
                target.value.id == "self" and scope.cls is not None and (key := f"self.{target.attr}") not in \
                s.forwards and not is_guarded():
            # a method that runs the model its object holds (`self.model(x)` in a mixin's `validate`):
            # the caller's `self.model` says whether it is the DDP model
            quiet = A.in_no_grad(m, scope, call.lineno)
            s.forwards[key] = (Related(m.path, call.lineno, f"`{key}(...)` in `{fn.name}`"), quiet)
        if m.resolve_function(call.func, scope) is not None:
            callee = m.resolve_function(call.func, scope)
            if callee is not fn and s.backward is None and any(
                    m.is_backward_call(x.call) for x in A.fn_direct_sites(m, callee)):
                s.backward = Related(m.path, call.lineno, f"the backward in `{getattr(callee, 'name', '?')}`")
            if callee is not fn and s.sets_device is None and callee in m.scopes and project.shows("sets_device"):
                s.sets_device = project.summary(m, callee).sets_device  # setup(args) -> default_setup(args)
            continue
        inner = project.summary_of_call(m, call.func, scope)
        if inner is None:
            continue
        if inner.collectives and not (guarded if guarded is not None else is_guarded()):
            colls.extend(inner.collectives)
        if s.backward is None and inner.backward is not None:
            s.backward = inner.backward
        s.inits_group = s.inits_group or inner.inits_group
        s.sets_device = s.sets_device or inner.sets_device
        if s.saves is None and inner.saves is not None and not (guarded if guarded is not None else is_guarded()):
            s.saves = inner.saves
        s.sets_epoch = s.sets_epoch or inner.sets_epoch  # hooks.start_epoch(loader, epoch) in a third file
    s.collectives = tuple(dict.fromkeys(colls))
    loops = A.training_loops(m, scope)
    if loops:
        s.trains = Related(m.path, loops[0].lineno, f"the training loop of `{fn.name}`")
    for loop, _c, _l in scope.loops:
        it = A.unwrap_iter(loop.iter) if isinstance(loop, (ast.For, ast.AsyncFor)) else None
        if isinstance(it, ast.Name) and it.id in params and it.id not in s.iterates:
            training = loop in loops
            what = "trains on" if training else "iterates"
            s.iterates[it.id] = (Related(m.path, loop.lineno, f"`{fn.name}` {what} `{it.id}` here"), training)
    s.sets_epoch = s.sets_epoch or any(final_name(x.call.func) == "set_epoch" for x in scope.sites)
    if fn.name == "__init__" and scope.cls is not None:
        _iterated_attributes(m, scope, s)
    for r in m.returns_of(fn):
        v = r.value
        if v is None:
            continue
        _value_facts(m, v, r.lineno, scope, fn.name, s.returns)
        if isinstance(v, (ast.Tuple, ast.List)) and not any(isinstance(e, ast.Starred) for e in v.elts):
            # `return train_loader, valset, collate_fn`: the caller unpacks it
            for i, elt in enumerate(v.elts):
                facts = s.items.setdefault(i, {})
                _value_facts(m, elt, r.lineno, scope, fn.name, facts)
        elif isinstance(v, ast.Dict):  # `return {"train": train_loader, "val": val_loader}`
            for k, elt in zip(v.keys, v.values):
                if isinstance(k, ast.Constant) and isinstance(k.value, str):
                    _value_facts(m, elt, r.lineno, scope, fn.name, s.items.setdefault(k.value, {}))
    s.items = {i: f for i, f in s.items.items() if f}
    s.rank_value = _rank_value(m, fn, scope)
    if s.backward is not None:
        s.early_return, s.early_return_on = _early_return(m, fn, scope, positional)
    return s


def _iterated_attributes(m: "ModuleModel", scope: Scope, s: FunctionSummary) -> None:
    """``Trainer(model, loader)``: the constructor keeps ``loader`` as ``self.train_data`` and a method
    loops over it (with a backward: training; each epoch: when that method is called in a loop)."""
    from ddp_doctor.lint import analysis as A

    kept = {f"self.{t.attr}": v.id for stmt, _c, _l in scope.stmts if isinstance(stmt, ast.Assign)
            for t in stmt.targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and
            t.value.id == "self" and isinstance(v := stmt.value, ast.Name) and v.id in s.params}
    epochs = set()
    for method in m.methods.get(scope.cls, {}).values():
        ms = m.scopes.get(method)
        if ms is None or method is scope.node:
            continue
        s.sets_epoch = s.sets_epoch or any(final_name(x.call.func) == "set_epoch" for x in ms.sites)
        training = A.training_loops(m, ms)
        for loop, _c, outer in ms.loops:
            it = A.unwrap_iter(loop.iter) if isinstance(loop, (ast.For, ast.AsyncFor)) else None
            pname = kept.get(dotted(it) or "") if it is not None else None
            if pname is None or pname in s.iterates:
                continue
            what = "trains on" if loop in training else "iterates"
            s.iterates[pname] = (Related(m.path, loop.lineno, f"`{method.name}` {what} `self.{it.attr}` here"),
                                 loop in training)
            if outer or A._called_in_loop(m, ms):
                epochs.add(pname)
    s.iterated_over_epochs = frozenset(epochs)


def _value_facts(m: "ModuleModel", v: ast.expr, line: int, scope: Scope, name: str,
                 facts: dict[str, Related]) -> None:
    """What a returned value ``v`` holds ("loader", "shuffled_sampler", "sampler", "ddp"), into ``facts``."""
    from ddp_doctor.lint import analysis as A

    if "loader" not in facts:
        loaders = A.resolve_loaders(m, v, scope)
        if loaders:
            call, lscope = loaders[0]
            facts["loader"] = Related(m.path, call.lineno, f"the DataLoader made in `{name}`")
            sampler = _shuffling_sampler_of(m, call, lscope)
            if sampler is not None:
                facts["shuffled_sampler"] = Related(
                    m.path, sampler.lineno, f"the shuffling DistributedSampler of the DataLoader made in `{name}`")
    if "sampler" not in facts and _is_sampler_value(m, v, scope):
        facts["sampler"] = Related(m.path, line, f"the DistributedSampler returned by `{name}`")
    if "ddp" not in facts and m.is_ddp_value(v, scope):
        facts["ddp"] = Related(m.path, line, f"the DDP model returned by `{name}`")


def _early_return(m: "ModuleModel", fn: ast.AST, scope: Scope, params: list[str]):
    """``if not torch.isfinite(loss): return`` before the backward of a training-step helper: the
    ``return`` and the parameters whose per-rank value (a batch, a model's output) makes its condition
    differ between ranks.  Each parameter is tried alone, so ``if cfg.dry_run: return`` depends on none
    that a caller passes its batch or model in."""
    from ddp_doctor.lint import analysis as A
    from ddp_doctor.lint.rules.steps import varying_reason
    from ddp_doctor.lint.varying import RankVariance

    returns = [j for j in scope.jumps if j.kind == "return" and not j.loops and j.conds]
    bws = [b for b in A.backward_sites(m, scope) if not b.loops] if returns else []
    if not bws:
        return None, ()
    first = min(b.call.lineno for b in bws)
    returns = [j for j in returns if j.stmt.lineno < first]
    for j in returns:
        on, reason = [], None
        for p in params:
            got = varying_reason(m, scope, j.conds, RankVariance(m, scope, frozenset([p])))
            if got is not None:
                on.append(p)
                reason = reason or got[0]
        if on:
            return Related(m.path, j.stmt.lineno, f"the `return` under `{reason}` in `{fn.name}`, before its "
                                                  f"backward"), tuple(on)
    return None, ()


def _shuffling_sampler_of(m: "ModuleModel", loader: ast.Call, scope: Scope) -> ast.Call | None:
    """The DistributedSampler (shuffle not False) given to ``loader``, when the function sets no epoch."""
    from ddp_doctor.lint.names import alternatives, arg_or_kw

    s = m.call_arg(loader, None, "sampler", scope)
    if s is None:
        return None
    vals = [s] if isinstance(s, (ast.Call, ast.IfExp)) else m.values_of(s, scope)
    cands = [a for v in vals for a in alternatives(v)]
    for c in cands:
        if isinstance(c, ast.Call) and m.is_sampler_call(c):
            shuffle = arg_or_kw(c, 3, "shuffle")
            if shuffle is None or (isinstance(shuffle, ast.Constant) and shuffle.value is True):
                return c
            if isinstance(shuffle, ast.Name) and not m.values_of(shuffle, scope) and any(
                    isinstance(a, ast.Constant) and a.value is True for a, _s in m.param_args(shuffle, scope)):
                return c  # `shuffle=train`, with `_loader(train_set, True)` for the training loader here
            if isinstance(shuffle, ast.Name) and not m.values_of(shuffle, scope) and \
                    _param_default(scope.node, shuffle.id) is True and not any(
                    isinstance(a, ast.Constant) and a.value is False for a, _s in m.param_args(shuffle, scope)):
                return c  # `def build_loader(ds, shuffle=True)`: it shuffles unless a caller says otherwise
    return None


def _param_default(fn: ast.AST, name: str):
    """The constant default of parameter ``name`` of ``fn`` (``...`` when it has none or it is not a constant)."""
    args = getattr(fn, "args", None)
    if args is None:
        return ...
    pos = [*args.posonlyargs, *args.args]
    pairs = list(zip(pos[len(pos) - len(args.defaults):], args.defaults)) + \
        [(a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is not None]
    for a, d in pairs:
        if a.arg == name:
            return d.value if isinstance(d, ast.Constant) else ...
    return ...


def _is_sampler_value(m: "ModuleModel", v: ast.expr, scope: Scope, depth: int = 0) -> bool:
    if depth > 4:
        return False
    if isinstance(v, ast.Call):
        return m.is_sampler_call(v)
    return any(x is not v and _is_sampler_value(m, x, scope, depth + 1) for x in m.values_of(v, scope))


def _rank_value(m: "ModuleModel", fn: ast.AST, scope: Scope) -> str | None:
    """``def get_rank(): return dist.get_rank() if ... else 0`` -> "rank"; ``is_main_process()`` -> "main"."""
    rets = [r.value for r in m.returns_of(fn) if r.value is not None]
    if not rets or len(rets) > 4 or not any(m.mentions_rank(r, scope) for r in rets):
        return None
    per_rank = []
    for r in RANKS:
        vals: set = set()
        try:
            for v in rets:
                vals |= _Eval(m, scope, r, {}).ev(v, 0)
        except Exception:  # noqa: BLE001 - not a plain function of the rank
            vals = {object()}
        per_rank.append(vals)
    if all(v == {r} or v == {r, 0} for r, v in zip(RANKS, per_rank)) and per_rank[1] != per_rank[0]:
        return "rank"
    if all(v == {r == 0} for r, v in zip(RANKS, per_rank)):
        return "main"
    return None
