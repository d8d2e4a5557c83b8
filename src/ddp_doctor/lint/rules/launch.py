"""DDP206 launch-not-at-entry: process-group / Fabric launch outside the program's entry point."""
from __future__ import annotations

import ast

from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.scopes import Scope
from ddp_doctor.lint.rules.base import Context, Rule


class LaunchNotAtEntry(Rule):
    code = "DDP206"

    _CTORS = ("__init__", "__new__", "__post_init__")

    def check(self, ctx: Context) -> None:
        m = ctx.model
        for scope in m.scopes.values():
            for site in scope.sites:
                what = self._launch(m, site.call, scope)
                if what is None:
                    continue
                where = None
                if not scope.is_module and scope.name in self._CTORS and scope.cls is not None:
                    if "launch" not in what and self._built_once_at_entry(m, scope.cls.name):
                        continue  # fabric.launch() stays reported: it starts the processes itself
                    where = f"the constructor `{scope.cls.name}.{scope.name}`"
                elif scope.is_module and m.has_main_guard and self._spawns(m) and not any(
                        m._is_main_guard(c.test) for c in site.conds):
                    where = ("module level of a script that spawns its workers with multiprocessing (every spawned "
                             "process re-imports the module and runs it again)")
                if where is None:
                    continue
                ctx.report(
                    self.code, site.call,
                    f"{what} is called in {where}: the distributed launch then runs as a side effect of "
                    f"building an object or importing a module — again in every spawned process, or in an "
                    f"order that differs between ranks — which deadlocks at start-up or at the first collective.",
                    f"Call {what} once, at the program entry (`if __name__ == \"__main__\":` / `main()`), before "
                    f"building trainers, models and datasets.",
                )

    def _built_once_at_entry(self, m: ModuleModel, cls: str) -> bool:
        """A torchrun script's recipe or trainer class built once by its entry function (torchtune's
        ``recipe = FullFinetuneRecipeDistributed(cfg=cfg)`` in ``recipe_main``): its constructor's
        ``init_process_group`` runs once per process, at start-up, as set-up in ``main()`` does.  Not so in a script that spawns its workers, or for a
        class built in a loop, twice, or nowhere in this file (an actor another program builds)."""
        if not m.has_main_guard or self._spawns(m):
            return False
        sites = [s for sc in m.scopes.values() for s in sc.sites
                 if isinstance(s.call.func, ast.Name) and s.call.func.id == cls]
        return len(sites) == 1 and not sites[0].loops and not sites[0].scope.is_module or (
            len(sites) == 1 and sites[0].scope.is_module and any(m._is_main_guard(c.test) for c in sites[0].conds))

    @staticmethod
    def _spawns(m: ModuleModel) -> bool:
        for sc in m.scopes.values():
            for s in sc.sites:
                q = m.qual(s.call.func) or ""
                if q in ("torch.multiprocessing.spawn", "torch.multiprocessing.start_processes",
                         "multiprocessing.Process", "torch.multiprocessing.Process") or \
                        q.endswith("multiprocessing.spawn"):
                    return True
        return False

    @staticmethod
    def _launch(m: ModuleModel, call: ast.Call, scope: Scope) -> str | None:
        q = m.qual(call.func) or ""
        if q in ("torch.distributed.init_process_group", "deepspeed.init_distributed"):
            return f"`{ast.unparse(call.func)}()`"
        f = call.func
        if isinstance(f, ast.Attribute) and f.attr == "launch" and m._receiver_kind(f.value, scope) == "fabric":
            return f"`{ast.unparse(f)}()`"
        return None
