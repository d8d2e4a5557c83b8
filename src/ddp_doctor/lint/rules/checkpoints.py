"""DDP303 save-on-every-rank: torch.save reached by every rank of a distributed script."""
from __future__ import annotations

import ast
import re

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import arg_or_kw
from ddp_doctor.lint.scopes import GuardedCall, Scope
from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.balance import once_per_node
from ddp_doctor.lint.function_summary import Related
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


_MULTI_NODE = re.compile(r"node_rank|NODE_RANK|nnodes|num_nodes|n_nodes|SLURM_NODEID|GROUP_RANK|get_node_rank")


def multi_node(m: ModuleModel) -> bool:
    """The script is written for several nodes: it reads a node index or a node count (here, or in the
    project file that imports it)."""
    if _MULTI_NODE.search(m.source):
        return True
    return m.project is not None and m.project.importer_shows(m, "multi_node") is not None


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
        if multi_node(m):
            self._helper_saves_once_per_node(ctx)
        for scope in m.scopes.values():
            for site in scope.sites:
                if m.qual(site.call.func) != "torch.save":
                    self._helper_saves_on_every_rank(ctx, site)
                    continue
                path = arg_or_kw(site.call, 1, "f")
                if path is not None and m.mentions_rank(path, scope):
                    continue  # a per-rank (or per-node) file (sharded checkpoint)
                if self._guarded(m, site):
                    if multi_node(m) and once_per_node(m, site.conds, scope):
                        ctx.report(
                            self.code, site.call,
                            "`torch.save` here runs once per node (its condition is a local-rank test), and this "
                            "is a multi-node script: with a file system the nodes share, every node writes the "
                            "same file at once (a torn or half-written checkpoint when they race).",
                            "Save on one rank of the job: test the global rank (`if dist.get_rank() == 0:`), or "
                            "put the node's index in the path if every node must keep its own copy.",
                        )
                    continue
                ctx.report(
                    self.code, site.call,
                    "`torch.save` here runs on every rank: all ranks write the same file at once (N times the "
                    "I/O, and a checkpoint that can be torn or half-written when two ranks race on it).",
                    "Save on one rank: `if dist.get_rank() == 0: torch.save(...)` (then `dist.barrier()` on "
                    "every rank if others read it next), or use `ddp_doctor.fixes.rank_zero_first`.",
                )

    def _helper_saves_on_every_rank(self, ctx: Context, site: GuardedCall) -> None:
        """``save_checkpoint(model, path)`` on every rank, where the helper of another project file saves
        whenever it is called (no rank test of its own, a path without the rank): reported at the call."""
        m = ctx.model
        if m.project is None or m.resolve_function(site.call.func, site.scope) is not None:
            return
        root = site.call.func
        while isinstance(root, ast.Attribute):
            root = root.value
        if not isinstance(root, ast.Name) or root.id not in m.import_from:
            return  # only imported helpers here (methods of objects are left to their class's file)
        summ = m.project.summary_of_call(m, site.call.func, site.scope)
        if summ is None or summ.saves is None or self._guarded(m, site):
            return
        ctx.report(
            self.code, site.call,
            f"`{ast.unparse(site.call.func)}(...)` saves a checkpoint ({summ.saves.message}, {summ.saves.where}) "
            "and runs on every rank here: all ranks write the same file at once (N times the I/O, and a "
            "checkpoint that can be torn or half-written when two ranks race on it).",
            "Call it on one rank: `if dist.get_rank() == 0: ...(...)` (then `dist.barrier()` on every rank if "
            "others read it next), or use `ddp_doctor.fixes.rank_zero_first`.",
            related=[summ.saves],
        )

    def _helper_saves_once_per_node(self, ctx: Context) -> None:
        """``if local_rank == 0: save_checkpoint(state, path)`` in a multi-node script, where the helper (this
        file or another project file) saves on every rank that calls it: once per node, as a direct save."""
        m = ctx.model
        for scope in m.scopes.values():
            for site in scope.sites:
                if not site.conds or m.qual(site.call.func) == "torch.save":
                    continue
                related = self._saving_helper(m, site)
                if related is None or not once_per_node(m, site.conds, scope):
                    continue
                ctx.report(
                    self.code, site.call,
                    f"`{ast.unparse(site.call.func)}(...)` saves a checkpoint ({related.message}, line "
                    f"{related.line}) and runs once per node here (its condition is a local-rank test), in a "
                    "multi-node script: with a file system the nodes share, every node writes the same file at "
                    "once (a torn or half-written checkpoint when they race).",
                    "Save on one rank of the job: test the global rank (`if dist.get_rank() == 0:`), or put "
                    "the node's index in the path if every node must keep its own copy.",
                    related=[related] if related.path != m.path else [],
                )

    @staticmethod
    def _saving_helper(m: ModuleModel, site: GuardedCall) -> Related | None:
        fn = m.resolve_function(site.call.func, site.scope)
        if fn is not None:
            inner = m.scopes.get(fn)
            for s in inner.sites if inner is not None and fn is not site.scope.node else ():
                path = arg_or_kw(s.call, 1, "f")
                if m.qual(s.call.func) == "torch.save" and not s.conds and \
                        not (path is not None and m.mentions_rank(path, inner)):
                    return Related(m.path, s.call.lineno, f"the `torch.save` in `{getattr(fn, 'name', '?')}`")
            return None
        if m.project is None:
            return None
        summ = m.project.summary_of_call(m, site.call.func, site.scope)
        return summ.saves if summ is not None else None

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
