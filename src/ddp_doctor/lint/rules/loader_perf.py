"""Loader performance rules: DDP401 data-bound, DDP402 loader-without-pin-memory, DDP403
workers-not-persistent."""
from __future__ import annotations

import ast

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import arg_or_kw, dotted, final_name
from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.rules.devices import in_ddp_program
from ddp_doctor.lint.rules.loader_facts import (
    LoadCost, dataset_unknown, dl_arg, expanded_test, expensive_dataset, num_workers_arg, training_loader_uses,
)


class DataBound(Rule):
    code = "DDP401"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        for orig, uses in training_loader_uses(m, expanded_test(m, _no_workers)).items():
            call = m.expand_star_kwargs(orig, uses[0].loader_scope)  # options in a `**loader_kwargs` dict
            if call is None:
                continue
            nw, val = num_workers_arg(call)
            if val != 0:
                continue
            if not in_ddp_program(m):
                return
            ds = dl_arg(call, "dataset")
            cost = expensive_dataset(m, ds, uses[0].loader_scope)
            if cost is None:
                # evidence before advice: in-memory tensors gain nothing from workers.  But a dataset of
                # unknown type is no evidence of cheap loading: with batches copied to the GPU at every
                # step, the GPU waits on it (0 % / 100 % utilisation); say that the type is unknown
                if not dataset_unknown(m, ds, uses[0].loader_scope) or \
                        not any(_moves_batches_to_cuda(m, u) for u in uses):
                    continue
                cost = LoadCost(f"dataset type unknown: `{ctx.text(ds, 40)}` is not a class or helper this "
                                f"project defines, and nothing shows its items are tensors already in memory")
            how = "no `num_workers`" if nw is None else "`num_workers=0`"
            what = "may be" if cost.why.startswith("dataset type unknown") else "is"
            ctx.report(
                self.code, orig,
                f"the training DataLoader has {how} and its dataset {what} expensive to load ({cost.why}): every "
                f"batch is loaded and transformed in the training process itself, so the GPU waits for the "
                f"data at every step (and in DDP the slowest rank's loading stalls all ranks).",
                "Load in background workers: `num_workers=4` (or more: about CPU cores / ranks per node), "
                "with `pin_memory=True` and `persistent_workers=True`; `ddp-doctor run` measures the data wait.",
                related=[cost.related] if cost.related is not None else [],
            )


def _moves_batches_to_cuda(m: ModuleModel, use: A.LoaderUse) -> bool:
    """Inside the loop, something that is not the model is sent to a CUDA device."""
    loop, scope = use.loop, use.scope
    m = scope.module  # the loop may be another file's (a caller of this file's loader factory)
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
        for orig, uses in training_loader_uses(m, expanded_test(m, _unpinned)).items():
            call = m.expand_star_kwargs(orig, uses[0].loader_scope)
            if call is None:
                continue
            if not in_ddp_program(m):
                return
            pm = dl_arg(call, "pin_memory")
            if pm is not None and A.literal(pm) is not False:
                continue
            if not any(_moves_batches_to_cuda(m, u) for u in uses):
                continue
            ctx.report(
                self.code, orig,
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
        for orig, uses in self._epoch_loaders(m).items():
            call = m.expand_star_kwargs(orig, uses[0].loader_scope)
            if call is None:
                continue
            nw, val = num_workers_arg(call)
            if nw is None or val == 0 or (isinstance(val, int) and val <= 0):
                continue
            pw = arg_or_kw(call, 99, "persistent_workers")
            if pw is not None and A.literal(pw) is not False:
                continue
            ctx.report(
                self.code, orig,
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
        # a factory's loader walked over epochs by a caller of another file (training loops only there)
        for call, uses in training_loader_uses(m, expanded_test(m, _workers_not_persistent), epochs=True).items():
            out.setdefault(call, uses)
        return out


def _no_workers(call: ast.Call) -> bool:
    return num_workers_arg(call)[1] == 0


def _unpinned(call: ast.Call) -> bool:
    pm = dl_arg(call, "pin_memory")
    return pm is None or A.literal(pm) is False


def _workers_not_persistent(call: ast.Call) -> bool:
    _nw, val = num_workers_arg(call)
    pw = arg_or_kw(call, 99, "persistent_workers")
    return isinstance(val, int) and val > 0 and (pw is None or A.literal(pw) is False)
