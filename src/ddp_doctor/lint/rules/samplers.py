"""Sampler rules: DDP102 sampler-epoch-not-set, DDP103 shuffle-with-sampler, DDP105
loader-without-distributed-sampler."""
from __future__ import annotations

import ast

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import alternatives, arg_or_kw, final_name, has_star_kwargs
from ddp_doctor.lint.scopes import Scope
from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.rules.devices import in_ddp_program
from ddp_doctor.lint.rules.loader_facts import (
    all_calls, dataset_is_iterable_or_sharded, dl_arg, is_none, training_loader_uses, uses_wrapper_loaders,
)


class SamplerEpochNotSet(Rule):
    code = "DDP102"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        uses = A.loader_uses(m)
        # `loader.dataset.set_epoch(epoch)` (timm: datasets that reshuffle their own shards) is the dataset's
        set_epoch_sites = [s for sc in m.scopes.values() for s in sc.sites if final_name(s.call.func) == "set_epoch"
                           and not _on_dataset(s.call.func)]
        for call, scope in list(all_calls(m, m.is_sampler_call)):
            shuffle = arg_or_kw(call, 3, "shuffle")
            if shuffle is not None and not _true(m, shuffle, scope):
                continue  # shuffle=False (or unknown): the order does not depend on the epoch
            if any(self._sets_epoch_of(m, s, call, uses) for s in set_epoch_sites) or _epoch_helper(m):
                continue
            # the loaders that use this sampler, and whether they are iterated over epochs
            # only loaders that drive training epochs: a validation loader's order does not matter
            drivers = [use for use in uses if use.epochs and use.training and not use.sets_epoch and
                       not use.returned and _loader_sampler_is(m, use.loader, use.loader_scope, call)]
            if not drivers:
                continue
            ctx.report(
                self.code, call,
                "this DistributedSampler shuffles, but its `set_epoch()` is never called: every epoch replays "
                "the same permutation on every rank (no reshuffling between epochs, which hurts convergence).",
                "Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the loader "
                "(e.g. `train_loader.sampler.set_epoch(epoch)`).",
                related=[u.via for u in drivers[:1] if u.via is not None],
            )

        if m.project is not None and not set_epoch_sites and not _epoch_helper(m):
            self._loaders_from_other_files(ctx)

    def _loaders_from_other_files(self, ctx: Context) -> None:
        """``loader = create_loader(...)`` (data/loader.py builds it with a shuffling DistributedSampler),
        iterated here over training epochs with no ``set_epoch`` anywhere in this file: reported at the
        call that brings the loader in, naming the sampler's line."""
        m = ctx.model
        done = set()
        for scope in m.scopes.values():
            for origin, where, related in self._epoch_walks(ctx, scope):
                call = origin.value if isinstance(origin, ast.Subscript) else origin
                if call in done:
                    continue
                sampler = m.call_result_facts(origin, scope).get("shuffled_sampler")
                if sampler is None:
                    continue
                done.add(call)
                ctx.report(
                    self.code, call,
                    f"the loader that `{ctx.text(call.func)}()` returns{_element(origin)} shuffles with a "
                    f"DistributedSampler ({sampler.where}), and {where} iterates it over training epochs "
                    f"without ever calling `set_epoch()`: every epoch replays the same permutation on every "
                    f"rank (no reshuffling between epochs, which hurts convergence).",
                    "Call `loader.sampler.set_epoch(epoch)` at the start of every epoch, before iterating "
                    "the loader.",
                    related=[sampler, *related],
                )

    @staticmethod
    def _epoch_walks(ctx: Context, scope: Scope):
        """(origin call of a loader, who walks it, related) for each loader of ``scope`` iterated over training
        epochs: by a loop of this file, or by a function or class of another project file it is handed to
        (``Trainer(model, build_loader(...)).fit()`` with the epoch loop in engine.py) that sets no epoch."""
        m = ctx.model
        training = A.training_loops(m, scope)
        for loop, _conds, outer in scope.loops:
            if loop not in training or not isinstance(loop, (ast.For, ast.AsyncFor)):
                continue
            if not (outer or A._called_in_loop(m, scope)):
                continue  # a single pass: no epoch to set
            for origin in _origin_calls(m, A.unwrap_iter(loop.iter), scope):
                yield origin, f"this file (line {loop.lineno})", ()
        if not m.uses_ddp:
            return  # the launching script (it wraps the model) is where a loader is handed to a trainer
        for site in scope.sites:
            if not site.call.args and not site.call.keywords or m.resolve_function(site.call.func, scope):
                continue
            summ = m.project.summary_of_call(m, site.call.func, scope)
            if summ is None or not summ.iterates or summ.sets_epoch:
                continue
            for i, pname in enumerate(summ.params):
                if pname not in summ.iterates:
                    continue
                related, trains = summ.iterates[pname]
                arg = arg_or_kw(site.call, i, pname)
                if arg is None or not trains or not (pname in summ.iterated_over_epochs or site.loops):
                    continue
                for origin in _origin_calls(m, arg, scope):
                    yield origin, f"`{ctx.text(site.call.func)}()` ({related.where})", (related,)

    @staticmethod
    def _sets_epoch_of(m: ModuleModel, site, sampler: ast.Call, uses) -> bool:
        """Does this ``X.set_epoch(...)`` call (possibly) reach ``sampler``?"""
        recv = site.call.func.value if isinstance(site.call.func, ast.Attribute) else None
        if recv is None:
            return True
        # loader.sampler.set_epoch / loader.batch_sampler.sampler.set_epoch
        base = recv
        while isinstance(base, ast.Attribute) and base.attr in ("sampler", "batch_sampler"):
            base = base.value
        if base is not recv:
            loaders = A.resolve_loaders(m, base, site.scope)
            if not loaders:
                return True
            return any(_loader_sampler_is(m, lc, ls, sampler) for lc, ls in loaders)
        if isinstance(recv, ast.Call):
            return recv is sampler
        vals = m.values_of(recv, site.scope)
        if not vals:
            return True  # a parameter or an object we cannot follow: assume it is this sampler
        known = [a for v in vals for a in alternatives(v) if isinstance(a, ast.Call) and m.is_sampler_call(a)]
        if not known:
            return True  # `s = train_sampler if cond else None`, built by a helper, ...: assume it is
        return sampler in known


def _none_here(m: ModuleModel, expr: ast.expr | None, scope: Scope) -> bool:
    """No argument, ``None``, or a name that is None on every assignment (``sampler = None`` and no other)."""
    if is_none(expr):
        return True
    vals = m.values_of(expr, scope) if isinstance(expr, ast.Name) and expr.id not in scope.params else []
    return bool(vals) and all(is_none(v) for v in vals)


def _on_dataset(func: ast.expr) -> bool:
    """``loader.dataset.set_epoch``: the loader's dataset's own epoch (DataLoader.dataset), not its sampler's."""
    recv = func.value if isinstance(func, ast.Attribute) else None
    return isinstance(recv, ast.Attribute) and recv.attr == "dataset"


def _epoch_helper(m: ModuleModel) -> bool:
    """A call into another project file's function that sets an epoch (``utils.start_epoch(loader,
    epoch)``): its target is not followed, so every sampler here counts as set."""
    def compute() -> bool:
        if m.project is None or not m.import_from:
            return False
        for scope in m.scopes.values():
            for site in scope.sites:
                if site.loops and m.resolve_function(site.call.func, scope) is None:
                    summ = m.project.summary_of_call(m, site.call.func, scope)
                    if summ is not None and summ.sets_epoch:
                        return True
        return False
    return A._cached(m, "epoch_helper", compute)


def _true(m: ModuleModel, expr: ast.expr, scope: Scope) -> bool:
    """``True``, or a parameter some caller here passes ``True`` (``data_sampler(ds, shuffle=True)``; a helper
    making the training and the evaluation loaders, ``_loader(train_set, True)``: it shuffles for training,
    and only a training loader is reported)."""
    if A.literal(expr) is True:
        return True
    args = m.param_args(expr, scope) if isinstance(expr, ast.Name) and not m.values_of(expr, scope) else []
    return any(A.literal(a) is True for a, _s in args)


def _element(origin: ast.expr) -> str:
    if not isinstance(origin, ast.Subscript):
        return ""
    key = origin.slice.value
    return f" (item {key} of its tuple)" if isinstance(key, int) else f" (its `{key!r}` entry)"


def _origin_calls(m: ModuleModel, expr: ast.expr, scope: Scope, depth: int = 0) -> list[ast.expr]:
    """The calls whose result ``expr`` holds: through assignments and, for a parameter, the arguments
    of this file's callers (``train_one_epoch(epoch, model, loader_train)``); ``build(cfg)[0]`` for an
    element of a returned tuple (``loader, valset, collate_fn = build(cfg)``)."""
    if depth > 3:
        return []
    if isinstance(expr, ast.Call) or isinstance(expr, ast.Subscript) and isinstance(expr.value, ast.Call):
        return [expr]
    if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
        # loaders["train"] with loaders = build_loaders(cfg): that entry of what the call returns
        return [ast.copy_location(ast.Subscript(value=o, slice=expr.slice), o) if isinstance(o, ast.Call) else o
                for o in _origin_calls(m, expr.value, scope, depth + 1)]
    out = []
    for v in m.values_of(expr, scope):
        if v is not expr:
            out += _origin_calls(m, v, m.scope_of_value(v, scope), depth + 1)
    if not out:
        for a, ascope in m.param_args(expr, scope):
            out += _origin_calls(m, a, ascope, depth + 1)
    return out


def _loader_sampler_is(m: ModuleModel, loader: ast.Call, scope: Scope, sampler: ast.Call) -> bool:
    s = m.call_arg(loader, 3, "sampler", scope)
    if s is None:
        bs = m.call_arg(loader, 4, "batch_sampler", scope)
        s = bs.args[0] if isinstance(bs, ast.Call) and bs.args else bs
    if s is None:
        return False
    vals = [s, *m.values_of(s, scope)]
    vals += [r for v in vals for r, _rs in m.returned_values(v, scope)]  # sampler=data_sampler(ds, ...)
    return any(a is sampler for v in vals for a in alternatives(v))


class ShuffleWithSampler(Rule):
    code = "DDP103"
    needs_distributed = False

    def check(self, ctx: Context) -> None:
        m = ctx.model
        for orig, scope in all_calls(m, m.is_dataloader_call):
            call = m.expand_star_kwargs(orig, scope)  # `shuffle=True` in a `**loader_kwargs` dict
            if call is None:
                continue
            shuffle = dl_arg(call, "shuffle")
            if A.literal(shuffle) is not True:
                continue
            sampler, bsampler = dl_arg(call, "sampler"), dl_arg(call, "batch_sampler")
            if is_none(sampler) and is_none(bsampler):
                continue
            which = "sampler" if not is_none(sampler) else "batch_sampler"
            kw = next((k for k in orig.keywords if k.arg == "shuffle"), None)  # --fix edits only this call
            star = next((k.value for k in orig.keywords if k.arg is None), None)
            through = f" (`shuffle=True` through `**{ctx.text(star, 30)}`)" if kw is None and star is not None else ""
            ctx.report(
                self.code, orig,
                f"DataLoader gets both `shuffle=True` and `{which}=`{through}: it raises `ValueError: {which} option is "
                f"mutually exclusive with shuffle` when it is built (shuffling belongs to the sampler; a "
                f"DistributedSampler shuffles by itself).",
                "Drop `shuffle=True` (shuffle in the sampler: `DistributedSampler(ds, shuffle=True)`), or use "
                "`shuffle=(sampler is None)`.",
                fix_kind="drop-shuffle" if kw is not None else None, fix_node=kw,
            )


class LoaderWithoutDistributedSampler(Rule):
    code = "DDP105"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.is_distributed or uses_wrapper_loaders(m):
            return
        def candidate(call: ast.Call, scope: Scope) -> bool:
            return _none_here(m, dl_arg(call, "sampler"), scope) and _none_here(m, dl_arg(call, "batch_sampler"), scope)

        for call, uses in training_loader_uses(m, candidate).items():
            if has_star_kwargs(call) or any(isinstance(a, ast.Starred) for a in call.args):
                continue
            scope = uses[0].loader_scope
            if not _none_here(m, dl_arg(call, "sampler"), scope) or \
                    not _none_here(m, dl_arg(call, "batch_sampler"), scope):
                continue
            if dataset_is_iterable_or_sharded(m, dl_arg(call, "dataset"), scope):
                continue
            if A.loader_passed_to_wrapper(m, call, scope):
                continue
            # a DDP script, or a data module whose loaders a DDP script walks (asked last: it costs)
            if not in_ddp_program(m):
                return
            ctx.report(
                self.code, call,
                "this training DataLoader has no DistributedSampler in a DDP script: every rank iterates the "
                "whole dataset in the same order, so the ranks train on identical batches (N times the work "
                "for one rank's worth of data, and an effective batch that is not what you think).",
                "Give it `sampler=DistributedSampler(dataset)` (and drop `shuffle=True`), and call "
                "`sampler.set_epoch(epoch)` every epoch.",
            )
