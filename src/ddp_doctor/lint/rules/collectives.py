"""DDP201 (collective on a subset of ranks) and DDP202 (DDP forward on a subset of ranks)."""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.function_summary import Related
from ddp_doctor.lint.names import arg_or_kw
from ddp_doctor.lint.scopes import Cond, GuardedCall, Scope
from ddp_doctor.lint.rules.base import Context, Rule


def _guard_text(ctx: Context, site: GuardedCall, conds: list[Cond]) -> str:
    if site.scope.rank_guarded_all and not conds:
        if site.scope.guard_hop is not None:
            name, hop = site.scope.guard_hop
            return f"`{site.scope.name}` is decorated with `@{name}`, which runs it only on some ranks ({hop.where})"
        return f"`{site.scope.name}` is decorated to run on rank 0 only"
    c = conds[-1]
    t = ctx.text(c.test, 50)
    stmt = c.node
    if stmt.lineno != site.stmt.lineno and isinstance(stmt, ast.If) and not _inside(site.stmt, stmt):
        return f"it comes after the early exit under `if {t}:` (line {stmt.lineno}), so only ranks " \
               f"where `not ({t})` reach it"
    return f"it runs only where `{t if c.positive else f'not ({t})'}` holds{_per_node(ctx, site, c)}"


def _rank_source(ctx: Context, site: GuardedCall, conds: list[Cond]) -> tuple[Related, ...]:
    """The other file's line where the condition's rank comes from (the launcher passing it to a
    constructor, the helper returning it; the wrapper of a project decorator), as a related location."""
    if not conds:
        hop = site.scope.guard_hop if site.scope.rank_guarded_all else None
        return (hop[1],) if hop is not None and hop[1].path != ctx.model.path else ()
    got = ctx.model.rank_origin(conds[-1].test, site.scope)
    if got is None:
        return ()
    return (Related(got[0], got[1], f"the rank in `{ctx.text(conds[-1].test, 40)}` comes from here"),)


def _per_node(ctx: Context, site: GuardedCall, c: Cond) -> str:
    """A local-rank test is true once per *node*: say so (one writer per node, not per job)."""
    if "local" not in ctx.text(c.test, 200).lower():
        return ""
    truths = ctx.model.rank_truths(c.test, site.scope, {})
    want = "T" if c.positive else "F"
    if truths is not None and truths.count(want) > 1:
        return " (a local-rank test: true on one rank of every node, so several ranks of a multi-node job)"
    return ""


def _inside(node: ast.AST, container: ast.AST) -> bool:
    return container.lineno <= node.lineno <= (container.end_lineno or container.lineno) and node is not container


def _groups(ctx: Context, scope: Scope, classify) -> dict[str, list[tuple[GuardedCall, list[Cond], Desc]]]:
    """Sites of ``scope`` classified by ``classify(site) -> (key, description) | None``."""
    groups: dict[str, list[tuple[GuardedCall, list[Cond], Desc]]] = {}
    for site in scope.sites:
        got = classify(site)
        if got is None:
            continue
        key, desc = got
        conds = ctx.model.rank_conds(site.conds, scope)
        groups.setdefault(key, []).append((site, conds, desc if isinstance(desc, Desc) else Desc(desc)))
    return groups


@dataclass(frozen=True)
class Desc:
    """How a finding names what the site does, and the other files' lines that show it."""

    text: str
    related: tuple[Related, ...] = ()
    sharded: bool = False  # the model is FSDP / FSDP2: its forward all-gathers parameters (DDP202's words)


def _other_file(ctx: Context, site: GuardedCall, scope: Scope, what: str):
    """The summary of the function of another project file that ``site`` calls, if it ``what``s."""
    m = ctx.model
    if m.project is None or not (site.conds or scope.rank_guarded_all):
        return None
    root = site.call.func
    while isinstance(root, ast.Attribute):
        root = root.value
    if not isinstance(root, ast.Name) or (root.id not in m.import_from and not isinstance(site.call.func, ast.Attribute)):
        return None  # not something imported nor a method of an object: no other file to look at
    if m.project.resolve_call(m, site.call.func, scope) is None:
        return None
    if not (scope.rank_guarded_all or m.rank_conds(site.conds, scope)):
        return None  # a call every rank makes adds one to every rank: it cannot unbalance a group
    return m.project.summary_of_call(m, site.call.func, scope)


def _unbalanced(ctx: Context, scope: Scope, group) -> list[tuple[GuardedCall, list[Cond], str]]:
    guarded = [g for g in group if g[1] or scope.rank_guarded_all]
    if not guarded:
        return []
    if scope.rank_guarded_all:
        return guarded
    m = ctx.model
    # every condition that involves the rank counts, even one constant over ranks 0..3
    # (`local_rank == -1` is False on every rank of a distributed run: the call never happens)
    full = [(tuple(c for c in s.conds if m.mentions_rank(c.test, scope)), scope) for s, _c, _d in group]
    if A.balanced(m, full):
        return []
    return [g for g, f in zip(group, full) if g in guarded and not A.never_runs(m, f[0], scope)]


class RankConditionalCollective(Rule):
    code = "DDP201"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        for scope in m.scopes.values():
            def classify(site: GuardedCall):
                name = m.collective_name(site.call, scope)
                if name:
                    if m.uses_subgroup(site.call):
                        return None
                    return name, f"`{ctx.text(site.call.func)}()`"
                fn = m.resolve_function(site.call.func, scope)
                if fn is not None and fn is not scope.node:
                    params = tuple(m.scopes[fn].params) if fn in m.scopes else ()
                    params = params[1:] if params[:1] in (("self",), ("cls",)) else params
                    inner = A.fn_collectives(m, fn) or [(n, c) for flag, n, c in A.fn_flagged_collectives(m, fn)
                                                        if A.passes_flag(site.call, params, flag)]
                    if inner:
                        cname, ccall = inner[0]
                        return (f"call:{fn.name}",
                                f"`{ctx.text(site.call.func)}()` (it calls `{ctx.text(ccall.func)}()` "
                                f"at line {ccall.lineno})")
                    return None
                summ = _other_file(ctx, site, scope, "collective")
                colls = () if summ is None else summ.collectives or tuple(
                    r for flag, r in summ.flagged_collectives if A.passes_flag(site.call, summ.params, flag))
                if colls:
                    r = colls[0]
                    return (f"call:{summ.path}:{summ.name}",
                            Desc(f"`{ctx.text(site.call.func)}()` (it enters {r.message} at {r.where})", (r,)))
                return None

            for key, group in _groups(ctx, scope, classify).items():
                for site, conds, desc in _unbalanced(ctx, scope, group):
                    why = _guard_text(ctx, site, conds)
                    ctx.report(
                        self.code, site.call,
                        f"collective {desc.text} is reached by only some ranks: {why}. A collective completes only "
                        f"when every rank of the group enters it; the other ranks never arrive and this one "
                        f"waits forever (a silent hang until the NCCL/gloo timeout).",
                        "Call it on every rank: keep the rank-0-only work under the condition and move the "
                        "collective out of it (or use `with ddp_doctor.fixes.rank_zero_first(): ...`).",
                        related=desc.related + _rank_source(ctx, site, conds),
                    )


class DDPForwardOnSubset(Rule):
    code = "DDP202"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.is_distributed:
            return
        for scope in m.scopes.values():
            def classify(site: GuardedCall):
                target = A.forward_target(site.call)
                if target is not None and m.is_ddp_value(target, scope):
                    if A.no_buffer_broadcast(m, target, scope) and A.in_no_grad(m, scope, site.call.lineno):
                        return None  # no_grad forward with broadcast_buffers=False runs no collective
                    made = tuple(r for v in m.values_of(target, scope)
                                 if (r := m.call_result_facts(v, scope).get("ddp")) is not None)[:1]
                    sharded = A.sharded(m, target, scope)
                    return "forward", Desc(f"the {_kind(sharded)} model `{ctx.text(target)}`", made, sharded)
                fn = m.resolve_function(site.call.func, scope)
                if fn is not None and fn is not scope.node:
                    inner = A.ddp_forward_in_fn(m, fn, site.call, scope)
                    if inner is not None:
                        sharded = any(A.sharded(m, a, scope) for a in site.call.args)
                        return "forward", Desc(f"`{ctx.text(site.call.func)}()`, which calls the {_kind(sharded)} "
                                               f"model (`{ctx.text(inner.func)}(...)` at line {inner.lineno}),",
                                               sharded=sharded)
                    return None
                summ = _other_file(ctx, site, scope, "forward")
                if summ is not None and summ.forwards:
                    on_self = isinstance(site.call.func, ast.Attribute) and isinstance(site.call.func.value, ast.Name) \
                        and site.call.func.value.id == "self"
                    attrs = [(-1, p) for p in summ.forwards if p.startswith("self.")] if on_self else []
                    for i, pname in [*enumerate(summ.params), *attrs]:
                        if pname not in summ.forwards:
                            continue
                        arg = arg_or_kw(site.call, i, pname) if i >= 0 else ast.copy_location(
                            ast.Attribute(value=ast.Name(id="self", ctx=ast.Load()), attr=pname[5:], ctx=ast.Load()),
                            site.call)
                        if arg is None or not m.is_ddp_value(arg, scope):
                            continue
                        r, quiet = summ.forwards[pname]
                        if (quiet or A.in_no_grad(m, scope, site.call.lineno)) and \
                                A.no_buffer_broadcast(m, arg, scope):
                            continue
                        sharded = A.sharded(m, arg, scope)
                        return "forward", Desc(f"`{ctx.text(site.call.func)}()`, which calls the {_kind(sharded)} "
                                               f"model `{ctx.text(arg)}` ({r.message} at {r.where}),", (r,), sharded)
                return None

            for _key, group in _groups(ctx, scope, classify).items():
                for site, conds, desc in _unbalanced(ctx, scope, group):
                    why = _guard_text(ctx, site, conds)
                    ctx.report(
                        self.code, site.call, f"{desc.text} is called on only some ranks: {why}. "
                        + (_SHARDED_WHY if desc.sharded else _DDP_WHY),
                        _SHARDED_FIX if desc.sharded else _DDP_FIX,
                        related=desc.related + _rank_source(ctx, site, conds),
                    )


_DDP_WHY = ("A DDP forward takes part in collectives (buffer broadcast, and the gradient all-reduce of the "
            "backward), so the ranks fall out of step: the job hangs, often only at the next epoch's training.")
_DDP_FIX = ("Evaluate the unwrapped model on the single rank (`model.module(x)`), or run the evaluation on every "
            "rank with a DistributedSampler and combine the metric with `dist.all_reduce` (or "
            "`ddp_doctor.fixes.gather_variable`).")
_SHARDED_WHY = ("Every forward of a sharded model all-gathers its parameter shards from every rank (under "
                "`no_grad` too), so the ranks fall out of step: the all-gathers pair with the others' training "
                "collectives and the job hangs or crashes.")
_SHARDED_FIX = ("Run the evaluation on every rank, each on its share of the data, and combine the metric with "
                "`dist.all_reduce`; for a rank-0-only pass, first gather a full state dict on every rank "
                "(`get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))`) and evaluate an "
                "unsharded copy on rank 0.")


def _kind(sharded: bool) -> str:
    return "FSDP-sharded" if sharded else "DDP"
