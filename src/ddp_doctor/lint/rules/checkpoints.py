"""DDP303 save-on-every-rank: torch.save reached by every rank of a distributed script."""
from __future__ import annotations

import ast

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import arg_or_kw
from ddp_doctor.lint.scopes import GuardedCall, Scope
from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.rules.devices import is_dist_script


def _callers_all_guarded(m: ModuleModel, fn: ast.AST) -> bool | None:
    """True: every in-file call of ``fn`` is under a rank condition; False: one is not; None: no caller here."""
    sites = m.call_sites_of(fn)
    if not sites:
        return None
    for s in sites:
        if not (m.rank_conds(s.conds, s.scope) or s.scope.rank_guarded_all or
                A.single_process_only(m, s.conds, s.scope)):
            if s.scope.is_module or not _in_guarded_fn(m, s.scope):
                return False
    return True


def _in_guarded_fn(m: ModuleModel, scope: Scope) -> bool:
    if scope.rank_guarded_all:
        return True
    sites = m.call_sites_of(scope.node)
    return bool(sites) and all(m.rank_conds(s.conds, s.scope) or s.scope.rank_guarded_all or
                               A.single_process_only(m, s.conds, s.scope) for s in sites)


def _training_function(m: ModuleModel, scope: Scope) -> bool:
    if scope.is_module:
        return True
    if m.function_referenced_as_value(scope.node):
        return True
    for site in scope.sites:
        q = m.qual(site.call.func) or ""
        if q.endswith("init_process_group") or m.is_ddp_call(site.call) or m.is_backward_call(site.call):
            return True
    return scope.name in ("main", "train", "main_worker", "run", "worker", "fit")


class SaveOnEveryRank(Rule):
    code = "DDP303"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not is_dist_script(m):
            return
        for scope in m.scopes.values():
            for site in scope.sites:
                if m.qual(site.call.func) != "torch.save":
                    continue
                if self._guarded(m, site):
                    continue
                path = arg_or_kw(site.call, 1, "f")
                if path is not None and m.mentions_rank(path, scope):
                    continue  # a per-rank file (sharded checkpoint)
                ctx.report(
                    self.code, site.call,
                    "`torch.save` here runs on every rank: all ranks write the same file at once (N times the "
                    "I/O, and a checkpoint that can be torn or half-written when two ranks race on it).",
                    "Save on one rank: `if dist.get_rank() == 0: torch.save(...)` (then `dist.barrier()` on "
                    "every rank if others read it next), or use `ddp_doctor.fixes.rank_zero_first`.",
                )

    @staticmethod
    def _guarded(m: ModuleModel, site: GuardedCall) -> bool:
        scope = site.scope
        if m.rank_conds(site.conds, scope) or scope.rank_guarded_all or A.single_process_only(m, site.conds, scope):
            return True  # rank-guarded, or never run under DDP (`if local_rank == -1:`)
        if scope.is_module:
            return False
        callers = _callers_all_guarded(m, scope.node)
        if callers is None:
            return not _training_function(m, scope)
        return callers
