"""Summaries of a whole module: is it a distributed script, does it wrap a model for data-parallel
training.  Rules that only make sense under DDP ask these first."""
from __future__ import annotations

import ast


class ModuleSummary:
    """Mixin of :class:`~ddp_doctor.lint.model.ModuleModel`: cached whole-module facts."""

    @property
    def is_distributed(self) -> bool:
        """The module uses torch.distributed, DDP, Fabric, accelerate or Lightning, itself or through a
        module of its project it imports (``from ..utils import comm``)."""
        if "distributed" in self._cache:
            return self._cache["distributed"]
        res = self.directly_distributed
        if not res and self.project is not None:
            res = self.project.imports_distributed(self)
        self._cache["distributed"] = res
        return res

    @property
    def directly_distributed(self) -> bool:
        """The module itself imports or names torch.distributed, DDP, Fabric, accelerate or Lightning."""
        if "directly_distributed" in self._cache:
            return self._cache["directly_distributed"]
        roots = ("torch.distributed", "torch.nn.parallel.DistributedDataParallel",
                 "torch.nn.parallel.distributed", "lightning", "pytorch_lightning", "lightning_fabric",
                 "accelerate", "torch.utils.data.DistributedSampler", "torch.utils.data.distributed",
                 "deepspeed", "torch.multiprocessing", "horovod")
        res = any(q == r or q.startswith(r + ".") for q in self.imports.values() for r in roots)
        if not res and any(w in self.source for w in ("distributed", "Distributed", "multiprocessing")):
            # fully qualified uses with a plain `import torch` (MAE, DINO): `torch.distributed.barrier()`,
            # `torch.nn.parallel.DistributedDataParallel(...)`, `torch.utils.data.DistributedSampler(...)`,
            # also references that are not calls (`sampler_cls = torch.utils.data.DistributedSampler`)
            for node in ast.walk(self.tree):
                if isinstance(node, ast.Attribute):
                    q = self.qual(node) or ""
                    if any(q == r or q.startswith(r + ".") for r in roots):
                        res = True
                        break
        self._cache["directly_distributed"] = res
        return res

    @property
    def uses_ddp(self) -> bool:
        """Some model here is wrapped for data-parallel training (DDP, Fabric.setup, accelerate.prepare)."""
        if "uses_ddp" not in self._cache:
            res = False
            for scope in self.scopes.values():
                for site in scope.sites:
                    c = site.call
                    if self.is_ddp_call(c):
                        res = True
                    elif isinstance(c.func, ast.Attribute) and c.func.attr in ("setup", "setup_module", "prepare",
                                                                             "prepare_model"):
                        if self._receiver_kind(c.func.value, scope) in ("fabric", "accelerator"):
                            res = True
                    if res:
                        break
                if res:
                    break
            self._cache["uses_ddp"] = res
        return self._cache["uses_ddp"]
