"""DDP-construction rules: DDP405 (find_unused_parameters=True), DDP406 (BatchNorm without SyncBatchNorm)."""
from __future__ import annotations

import ast

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.names import BATCHNORMS, final_name, kwarg
from ddp_doctor.lint.rules.base import Context, Rule

# torchvision constructors of models that contain BatchNorm
_BN_MODELS = ("resnet", "resnext", "wide_resnet", "vgg11_bn", "vgg13_bn", "vgg16_bn", "vgg19_bn", "densenet",
              "mobilenet", "efficientnet", "regnet", "inception", "googlenet", "shufflenet", "mnasnet",
              "convnext_bn")


class FindUnusedParameters(Rule):
    code = "DDP405"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        for scope in m.scopes.values():
            for site in scope.sites:
                call = site.call
                if not (m.is_ddp_call(call) or final_name(call.func) == "DDPStrategy"):
                    continue
                kw = kwarg(call, "find_unused_parameters")
                if kw is None or A.literal(kw.value) is not True:
                    continue
                ctx.report(
                    self.code, call,
                    "`find_unused_parameters=True` makes DDP traverse the autograd graph after every forward to "
                    "find parameters that get no gradient: extra CPU time each step, and it hides (instead of "
                    "fixing) a model that leaves parameters unused.",
                    "Use `find_unused_parameters=False` (the default) unless some parameters really get no "
                    "gradient in some steps; `ddp-doctor run` reports when none ever was unused.",
                )


class BatchNormWithoutSyncBN(Rule):
    code = "DDP406"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        src = m.source
        if "SyncBatchNorm" in src or "convert_sync_batchnorm" in src or "sync_batchnorm" in src:
            return
        if "BatchNorm" not in src and "torchvision" not in src:
            return
        ddp_sites = [s for sc in m.scopes.values() for s in sc.sites if m.is_ddp_call(s.call)]
        if not ddp_sites:
            return
        if not any(self._is_bn(m, s.call) for sc in m.scopes.values() for s in sc.sites):
            return
        for site in ddp_sites:
            ctx.report(
                self.code, site.call,
                "the model wrapped here has BatchNorm layers but no SyncBatchNorm: each rank normalises "
                "with the statistics of its own small per-GPU batch, and DDP broadcasts rank 0's running "
                "stats at every forward (fine for large per-GPU batches, harmful for small ones).",
                "If the per-GPU batch is small, convert before wrapping: "
                "`model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)`.",
            )

    @staticmethod
    def _is_bn(m, call: ast.Call) -> bool:
        q = m.qual(call.func) or ""
        name = final_name(call.func) or ""
        if q in BATCHNORMS or (not q and name.startswith("BatchNorm") and name[-2:] in ("1d", "2d", "3d")):
            return True
        return q.startswith("torchvision.models.") and name.startswith(_BN_MODELS)
