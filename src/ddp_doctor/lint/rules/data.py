"""Data-pipeline rules: DDP102, DDP103, DDP104, DDP105, DDP401, DDP402, DDP403."""
from __future__ import annotations

import ast
import re

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import (
    ITERABLE_DATASETS, ModuleModel, Scope, arg_or_kw, dotted, final_name, has_star_kwargs,
)
from ddp_doctor.lint.rules.base import Context, Rule

# DataLoader(dataset, batch_size, shuffle, sampler, batch_sampler, num_workers, collate_fn, pin_memory, drop_last)
_POS = {"dataset": 0, "batch_size": 1, "shuffle": 2, "sampler": 3, "batch_sampler": 4, "num_workers": 5,
        "collate_fn": 6, "pin_memory": 7, "drop_last": 8, "persistent_workers": 99}


def dl_arg(call: ast.Call, name: str) -> ast.expr | None:
    return arg_or_kw(call, _POS[name], name)


def is_none(node: ast.AST | None) -> bool:
    return node is None or (isinstance(node, ast.Constant) and node.value is None)


def _all_calls(m: ModuleModel, pred):
    for scope in m.scopes.values():
        for site in scope.sites:
            if pred(site.call):
                yield site.call, scope


def _uses_wrapper_loaders(m: ModuleModel) -> bool:
    """Fabric / accelerate / Lightning own the sampler (they add a DistributedSampler and set its epoch)."""
    return any(q.split(".")[0] in ("lightning", "pytorch_lightning", "accelerate", "lightning_fabric")
               for q in m.imports.values())


def _dataset_is_iterable_or_sharded(m: ModuleModel, ds: ast.expr | None, scope: Scope, depth: int = 0) -> bool:
    if ds is None or depth > 3:
        return True  # unknown: stay quiet
    if isinstance(ds, ast.Call):
        q = m.qual(ds.func)
        name = final_name(ds.func) or ""
        if q in ITERABLE_DATASETS or "Iterable" in name or name in ("IterableWrapper", "WebDataset",
                                                                       "load_dataset", "StreamingDataset",
                                                                       "IterDataPipe"):
            return True
        cls = m.classes.get(name)
        if cls is not None:
            for b in cls.bases:
                bq = m.qual(b) or final_name(b) or ""
                if bq in ITERABLE_DATASETS or "Iterable" in bq or "IterDataPipe" in bq:
                    return True
        if any(_per_rank(m, a, scope) for a in (*ds.args, *(k.value for k in ds.keywords))):
            return True  # Subset(ds, range(rank, n, world)) and friends: already split per rank
        text = ast.dump(ds)
        if "shard" in text or "split_dataset_by_node" in text:
            return True
        fn = m.resolve_function(ds.func, scope)
        if fn is not None and depth < 2:
            return any(_dataset_is_iterable_or_sharded(m, r.value, m.scopes[fn], depth + 1)
                       for r in m.returns_of(fn) if r.value is not None)
        return False
    if isinstance(ds, (ast.Name, ast.Attribute)):
        vals = m.values_of(ds, scope)
        if not vals:
            return True  # a parameter or unknown object
        return any(_dataset_is_iterable_or_sharded(m, v, scope, depth + 1) for v in vals if v is not ds)
    return True


def _per_rank(m: ModuleModel, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
    """Is ``expr`` derived from the rank (``rank``, ``list(DistributedSampler(ds))``, ...)?"""
    if depth > 3:
        return False
    if m.mentions_rank(expr, scope):
        return True
    for n in ast.walk(expr):
        if isinstance(n, ast.Call) and m.is_sampler_call(n):
            return True
        if isinstance(n, ast.Name) and n.id not in m.imports:
            for v in m.values_of(n, scope):
                if v is not expr and _per_rank(m, v, scope, depth + 1):
                    return True
    return False


_LOADING = re.compile(r"open|load|read|decode|imread|Image|transform|augment|sleep|fetch|tokeni|resize|crop|"
                      r"flip|request|download|cv2|PIL|np\.|numpy|pickle|json|h5|lmdb|zip", re.I)


def _in_memory_dataset(m: ModuleModel, ds: ast.expr | None, scope: Scope, depth: int = 0) -> bool:
    """A dataset that only indexes tensors already in memory (no file I/O, no transforms)."""
    if ds is None or depth > 6:
        return False
    if isinstance(ds, ast.Call):
        name = final_name(ds.func) or ""
        if name == "TensorDataset":
            return True
        if name in ("Subset", "ConcatDataset", "random_split") and ds.args:
            first = ds.args[0]
            if isinstance(first, (ast.List, ast.Tuple)) and first.elts:
                return all(_in_memory_dataset(m, e, scope, depth + 1) for e in first.elts)
            return _in_memory_dataset(m, first, scope, depth + 1)
        cls = m.classes.get(name)
        if cls is not None:
            getitem = m.methods.get(cls, {}).get("__getitem__") or m.methods.get(cls, {}).get("__iter__")
            if getitem is None:
                return False
            for c in ast.walk(getitem):
                if isinstance(c, ast.Call) and _LOADING.search(ast.unparse(c.func)):
                    return False
            init = m.methods.get(cls, {}).get("__init__")
            return init is None or not any(isinstance(c, ast.Call) and "transform" in ast.unparse(c).lower()
                                           for c in ast.walk(getitem))
        fn = m.resolve_function(ds.func, scope)
        if fn is not None:
            rets = [r.value for r in m.returns_of(fn) if r.value is not None]
            return bool(rets) and all(_in_memory_dataset(m, r, m.scopes[fn], depth + 1) for r in rets)
        return False
    if isinstance(ds, ast.Subscript):
        return _in_memory_dataset(m, ds.value, scope, depth + 1)
    if isinstance(ds, (ast.Name, ast.Attribute)):
        vals = [v for v in m.values_of(ds, scope) if v is not ds]
        return bool(vals) and all(_in_memory_dataset(m, v, scope, depth + 1) for v in vals)
    return False


class SamplerEpochNotSet(Rule):
    code = "DDP102"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        uses = A.loader_uses(m)
        set_epoch_sites = [s for sc in m.scopes.values() for s in sc.sites if final_name(s.call.func) == "set_epoch"]
        for call, scope in list(_all_calls(m, m.is_sampler_call)):
            shuffle = arg_or_kw(call, 3, "shuffle")
            if shuffle is not None and A.literal(shuffle) is not True:
                continue  # shuffle=False (or unknown): the order does not depend on the epoch
            if any(self._sets_epoch_of(m, s, call, uses) for s in set_epoch_sites):
                continue
            # the loaders that use this sampler, and whether they are iterated over epochs
            if not any(use.epochs and _loader_sampler_is(m, use.loader, use.loader_scope, call) for use in uses):
                continue
            ctx.report(
                self.code, call,
                "this DistributedSampler shuffles, but its `set_epoch()` is never called: every epoch replays "
                "the same permutation on every rank (no reshuffling between epochs, which hurts convergence).",
                "Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the loader "
                "(e.g. `train_loader.sampler.set_epoch(epoch)`).",
            )


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
        known = [v for v in vals if isinstance(v, ast.Call) and m.is_sampler_call(v)]
        if not known:
            return True  # `s = train_sampler if cond else None`, built by a helper, ...: assume it is
        return sampler in known


def _loader_sampler_is(m: ModuleModel, loader: ast.Call, scope: Scope, sampler: ast.Call) -> bool:
    s = dl_arg(loader, "sampler")
    if s is None:
        bs = dl_arg(loader, "batch_sampler")
        s = bs.args[0] if isinstance(bs, ast.Call) and bs.args else bs
    if s is None:
        return False
    return s is sampler or any(v is sampler for v in m.values_of(s, scope))


class ShuffleWithSampler(Rule):
    code = "DDP103"
    needs_distributed = False

    def check(self, ctx: Context) -> None:
        m = ctx.model
        for call, _scope in _all_calls(m, m.is_dataloader_call):
            shuffle = dl_arg(call, "shuffle")
            if A.literal(shuffle) is not True:
                continue
            sampler, bsampler = dl_arg(call, "sampler"), dl_arg(call, "batch_sampler")
            if is_none(sampler) and is_none(bsampler):
                continue
            which = "sampler" if not is_none(sampler) else "batch_sampler"
            kw = next((k for k in call.keywords if k.arg == "shuffle"), None)
            ctx.report(
                self.code, call,
                f"DataLoader gets both `shuffle=True` and `{which}=`: it raises `ValueError: {which} option is "
                f"mutually exclusive with shuffle` when it is built (shuffling belongs to the sampler; a "
                f"DistributedSampler shuffles by itself).",
                "Drop `shuffle=True` (shuffle in the sampler: `DistributedSampler(ds, shuffle=True)`), or use "
                "`shuffle=(sampler is None)`.",
                fix_kind="drop-shuffle" if kw is not None else None, fix_node=kw,
            )


class CollateMayReturnNone(Rule):
    code = "DDP104"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        fns: dict[ast.AST, None] = {}
        for call, scope in _all_calls(m, m.is_dataloader_call):
            cf = dl_arg(call, "collate_fn")
            if cf is None:
                continue
            if isinstance(cf, ast.Call) and final_name(cf.func) == "partial" and cf.args:
                cf = cf.args[0]
            fn = m.resolve_function(cf, scope)
            if fn is None and isinstance(cf, ast.Name):
                cls = m.classes.get(cf.id)
                fn = m.methods.get(cls, {}).get("__call__") if cls is not None else None
            if fn is None and isinstance(cf, ast.Call):
                cls = m.classes.get(final_name(cf.func) or "")
                fn = m.methods.get(cls, {}).get("__call__") if cls is not None else None
            if fn is not None:
                fns[fn] = None
        for name, defs in m.functions.items():
            if name == "collate_fn":
                for d in defs:
                    fns[d] = None
        for fn in fns:
            for node in m.returns_of(fn):
                if (node.value is None or (isinstance(node.value, ast.Constant) and node.value.value is None)):
                    ctx.report(
                        self.code, node,
                        f"collate function `{fn.name}` returns None here: the training loop then gets a None "
                        f"batch on this rank only. Skipping it with `continue` makes ranks run different numbers "
                        f"of steps (hang); not skipping it crashes the rank.",
                        "Never return None from a collate_fn: re-sample or pad to a valid batch (or return an "
                        "empty batch and skip it on every rank together with `ddp_doctor.fixes.agree`).",
                    )


def _training_loader_uses(m: ModuleModel) -> dict[ast.Call, list[A.LoaderUse]]:
    out: dict[ast.Call, list[A.LoaderUse]] = {}
    for use in A.loader_uses(m):
        if use.training:
            out.setdefault(use.loader, []).append(use)
    return out


class LoaderWithoutDistributedSampler(Rule):
    code = "DDP105"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.uses_ddp or _uses_wrapper_loaders(m):
            return
        for call, uses in _training_loader_uses(m).items():
            if has_star_kwargs(call) or any(isinstance(a, ast.Starred) for a in call.args):
                continue
            if not is_none(dl_arg(call, "sampler")) or not is_none(dl_arg(call, "batch_sampler")):
                continue
            scope = uses[0].loader_scope
            if _dataset_is_iterable_or_sharded(m, dl_arg(call, "dataset"), scope):
                continue
            if A.loader_passed_to_wrapper(m, call, scope):
                continue
            ctx.report(
                self.code, call,
                "this training DataLoader has no DistributedSampler in a DDP script: every rank iterates the "
                "whole dataset in the same order, so the ranks train on identical batches (N times the work "
                "for one rank's worth of data, and an effective batch that is not what you think).",
                "Give it `sampler=DistributedSampler(dataset)` (and drop `shuffle=True`), and call "
                "`sampler.set_epoch(epoch)` every epoch.",
            )


def _num_workers(call: ast.Call):
    nw = dl_arg(call, "num_workers")
    return nw, (0 if nw is None else A.literal(nw))


class DataBound(Rule):
    code = "DDP401"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.uses_ddp:
            return
        for call, uses in _training_loader_uses(m).items():
            if has_star_kwargs(call):
                continue
            nw, val = _num_workers(call)
            if val != 0:
                continue
            if _in_memory_dataset(m, dl_arg(call, "dataset"), uses[0].loader_scope):
                continue  # in-memory tensors: workers would only add overhead
            how = "no `num_workers`" if nw is None else "`num_workers=0`"
            ctx.report(
                self.code, call,
                f"the training DataLoader has {how}: every batch is loaded and transformed in the training "
                f"process itself, so the GPU waits for the data at every step (and in DDP the slowest rank's "
                f"loading stalls all ranks).",
                "Load in background workers: `num_workers=4` (or more: about CPU cores / ranks per node), "
                "with `pin_memory=True` and `persistent_workers=True`; `ddp-doctor run` measures the data wait.",
            )


def _moves_batches_to_cuda(m: ModuleModel, use: A.LoaderUse) -> bool:
    """Inside the loop, something that is not the model is sent to a CUDA device."""
    loop, scope = use.loop, use.scope
    mentions_cuda = "cuda" in m.source
    for site in scope.sites:
        if loop not in site.loops:
            continue
        f = site.call.func
        if not isinstance(f, ast.Attribute) or f.attr not in ("cuda", "to"):
            continue
        recv = (dotted(f.value) or "").split(".")[-1].lower()
        if any(k in recv for k in ("model", "net", "criterion", "loss_fn", "module")) or \
                m.is_ddp_value(f.value, scope):
            continue
        if f.attr == "cuda":
            return True
        target = site.call.args[0] if site.call.args else next(
            (k.value for k in site.call.keywords if k.arg == "device"), None)
        if target is None:
            continue
        lit = A.literal(target)
        if isinstance(lit, str):
            if lit.startswith("cuda"):
                return True
            continue
        tname = (dotted(target) or "").lower()
        if tname.startswith("torch.") or "dtype" in tname or "float" in tname or "half" in tname:
            continue  # a dtype conversion
        if mentions_cuda and isinstance(target, (ast.Name, ast.Attribute, ast.Call)) and "cpu" not in tname:
            if isinstance(target, ast.Call) and final_name(target.func) not in ("device",):
                continue
            return True
    return False


class LoaderWithoutPinMemory(Rule):
    code = "DDP402"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.uses_ddp:
            return
        for call, uses in _training_loader_uses(m).items():
            if has_star_kwargs(call):
                continue
            pm = dl_arg(call, "pin_memory")
            if pm is not None and A.literal(pm) is not False:
                continue
            if not any(_moves_batches_to_cuda(m, u) for u in uses):
                continue
            ctx.report(
                self.code, call,
                "batches from this loader are copied to the GPU but the loader does not pin memory: each "
                "host-to-device copy goes through pageable memory and cannot overlap with compute.",
                "Pass `pin_memory=True` to the DataLoader and copy with `.to(device, non_blocking=True)` "
                "(or use `ddp_doctor.fixes.CUDAPrefetcher`).",
            )


class WorkersNotPersistent(Rule):
    code = "DDP403"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.is_distributed:
            return
        for use_call, uses in self._epoch_loaders(m).items():
            call = use_call
            if has_star_kwargs(call):
                continue
            nw, val = _num_workers(call)
            if nw is None or val == 0 or (isinstance(val, int) and val <= 0):
                continue
            pw = arg_or_kw(call, 99, "persistent_workers")
            if pw is not None and A.literal(pw) is not False:
                continue
            ctx.report(
                self.code, call,
                "this DataLoader has worker processes but not `persistent_workers=True`: they are shut down at "
                "the end of every epoch and started again (re-importing, re-opening files, re-building the "
                "dataset copy) at the start of the next, stalling every rank for that time.",
                "Pass `persistent_workers=True` (with a non-literal `num_workers`, "
                "`persistent_workers=num_workers > 0`).",
                fix_kind="persistent-workers" if pw is None else None,
            )

    @staticmethod
    def _epoch_loaders(m: ModuleModel) -> dict[ast.Call, list[A.LoaderUse]]:
        out: dict[ast.Call, list[A.LoaderUse]] = {}
        for use in A.loader_uses(m):
            if use.epochs:
                out.setdefault(use.loader, []).append(use)
        return out


__all__ = ["SamplerEpochNotSet", "ShuffleWithSampler", "CollateMayReturnNone", "LoaderWithoutDistributedSampler",
           "DataBound", "LoaderWithoutPinMemory", "WorkersNotPersistent", "dotted"]
