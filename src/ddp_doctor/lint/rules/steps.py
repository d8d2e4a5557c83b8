"""DDP101: a data-, loss- or rank-dependent continue/break/return in a DDP training loop."""
from __future__ import annotations

import ast

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.flow import under_join
from ddp_doctor.lint.names import arg_or_kw, final_name, kwarg
from ddp_doctor.lint.scopes import Scope
from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.rules.devices import in_ddp_program
from ddp_doctor.lint.varying import RankVariance, has_collective, rank_variance

_SIZE_ATTRS = {"shape", "size", "numel", "__len__"}


def _names(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


def _size_only(test: ast.expr, tainted: set[str]) -> bool:
    """``x.size(0) != args.batch_size``: a batch-size test, the same on every rank (not a filter)."""
    for n in ast.walk(test):
        if isinstance(n, ast.Compare):
            for side in (n.left, *n.comparators):
                if isinstance(side, ast.Constant) and side.value in (0, None) and not isinstance(side.value, bool):
                    return False  # `len(batch) == 0`: an emptied (filtered) batch, not a size test
    if isinstance(test, ast.UnaryOp):
        return False
    ok = False
    parents = {}
    for n in ast.walk(test):
        for ch in ast.iter_child_nodes(n):
            parents[ch] = n
    for n in ast.walk(test):
        if isinstance(n, ast.Name) and n.id in tainted:
            p, wrapped = parents.get(n), False
            cur = n
            while p is not None:
                if isinstance(p, ast.Attribute) and p.attr in _SIZE_ATTRS:
                    wrapped = True
                    break
                if isinstance(p, ast.Call) and final_name(p.func) == "len" and cur in p.args:
                    wrapped = True
                    break
                cur, p = p, parents.get(p)
            if not wrapped:
                return False
            ok = True
    return ok


def _exhausted_iterator(m: ModuleModel, test: ast.expr, scope: Scope) -> bool:
    """``batch is None`` with ``batch = next(it, None)``: the end of the data, like a for loop ending."""
    name = None
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], ast.Is) and \
            isinstance(test.left, ast.Name) and isinstance(test.comparators[0], ast.Constant) and \
            test.comparators[0].value is None:
        name = test.left.id
    elif isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not) and isinstance(test.operand, ast.Name):
        name = test.operand.id
    if name is None:
        return False
    vals = scope.lookup(name)
    return bool(vals) and all(isinstance(v, ast.Call) and final_name(v.func) == "next" for v in vals) and any(
        len(v.args) == 2 and isinstance(v.args[1], ast.Constant) and v.args[1].value is None for v in vals)


def _encloses(container: ast.AST, node: ast.AST) -> bool:
    return container.lineno <= node.lineno <= (container.end_lineno or container.lineno)


_END_OF_DATA = {"StopIteration", "StopAsyncIteration"}
_LOADS = {"open", "load", "read", "read_bytes", "read_text", "imread", "decode", "decode_image", "read_image",
          "urlopen", "get", "fetch", "__getitem__", "__next__"}


def _data_exception(ctx: Context, scope: Scope, stmt: ast.stmt, loop: ast.stmt, rv: RankVariance):
    """``try: batch = next(it) / load(path) except OSError: continue``: a handler inside the training loop
    that catches a rank's own loading error (not the end of the data, which every rank reaches together)."""
    for other, _conds, _loops in scope.stmts:
        if not isinstance(other, ast.Try) or not _encloses(loop, other) or other is loop:
            continue
        for h in other.handlers:
            if not any(n is stmt for b in h.body for n in ast.walk(b)):
                continue
            caught = [] if h.type is None else [final_name(t) for t in (
                h.type.elts if isinstance(h.type, ast.Tuple) else [h.type])]
            if caught and all(c in _END_OF_DATA for c in caught):
                sampler = _per_rank_batch_sampler(ctx.model, other, scope)
                if sampler is None:
                    return None  # the end of the data, which every rank reaches at the same step
                return f"except {ctx.text(h.type, 40)}` from `{ctx.text(sampler.func, 40)}", "uneven"
            loads = any(isinstance(c, ast.Call) and (final_name(c.func) in _LOADS or rv.sources(c))
                        for b in other.body for c in ast.walk(b))
            if loads:
                text = "except" + (f" {ctx.text(h.type, 40)}" if h.type is not None else "")
                return text, "exception"
    return None


def _per_rank_batch_sampler(m: ModuleModel, try_stmt: ast.Try, scope: Scope) -> ast.Call | None:
    """The batch sampler behind ``next(it)`` in ``try_stmt``'s body when it forms each rank's batches from
    that rank's own shard (built with the rank, and not torch's ``BatchSampler`` over a DistributedSampler,
    which pads every rank to the same length): the ranks' iterators then end after different numbers of
    batches (a bucketing sampler)."""
    for b in try_stmt.body:
        for c in ast.walk(b):
            if not (isinstance(c, ast.Call) and final_name(c.func) == "next" and c.args):
                continue
            for loader, lscope in A.resolve_loaders(m, c.args[0], scope):
                bs = kwarg(loader, "batch_sampler")
                vals = [bs.value] if bs is not None else []
                vals = [v for x in vals for v in ([x] if isinstance(x, ast.Call) else m.values_of(x, lscope))]
                for v in vals:
                    if isinstance(v, ast.Call) and final_name(v.func) != "BatchSampler" and any(
                            m.mentions_rank(a, lscope) for a in (*v.args, *(k.value for k in v.keywords))) \
                            and not _evens_ranks(m, v, lscope):
                        return v
    return None


_WORLD_WORDS = ("replica", "world", "num_ranks", "nranks")


def _evens_ranks(m: ModuleModel, call: ast.Call, scope: Scope) -> bool:
    """The sampler's class (read here or in a project file) gives every rank the same number of batches, the
    way DistributedSampler does: it divides a count by the world size (``len(batches) // num_replicas``,
    ``math.ceil(n / world)``) to trim or pad each rank's share, or keeps a ``total_size`` / ``num_samples``."""
    got = m.class_def(call.func, scope)
    if got is None:
        return False
    for node in ast.walk(got[1]):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Div)) and any(
                w in (n.id if isinstance(n, ast.Name) else n.attr).lower() for n in ast.walk(node.right)
                if isinstance(n, (ast.Name, ast.Attribute)) for w in _WORLD_WORDS):
            return True
        if isinstance(node, (ast.Name, ast.Attribute)) and (node.id if isinstance(node, ast.Name) else node.attr) \
                in ("total_size", "num_samples") and isinstance(node.ctx, ast.Store):
            return True
    return False


def varying_reason(m: ModuleModel, scope: Scope, conds, rv: RankVariance) -> tuple[str, str] | None:
    """The innermost of ``conds`` whose truth can differ between ranks at its ``if``: (its text, "rank" or
    "data"), or None."""
    for c in reversed(conds):
        t = Context.text(None, c.test, 50)
        text = t if c.positive else f"not ({t})"
        if m.is_rank_condition(c.test, scope):
            return text, "rank"
        if has_collective(m, c.test, scope) or _exhausted_iterator(m, c.test, scope):
            continue
        hit = rv.varying_names(c.test, c.node)
        direct = [k for k in rv.sources(c.test) if k != "rank"]
        if (hit or direct) and not (hit and not direct and _size_only(c.test, hit)):
            return text, "data"
    return None


class UnevenSteps(Rule):
    code = "DDP101"

    def check(self, ctx: Context) -> None:
        m = ctx.model
        if not m.uses_ddp and not m.directly_distributed:
            return
        # a trainer class of another file that the DDP script hands its model to is asked only once a
        # step would be reported (finding its importers costs)
        if m.uses_ddp:
            self._uneven_datasets(ctx)
        for scope in m.scopes.values():
            loops = A.training_loops(m, scope)
            if not loops:
                continue
            self._early_return_helpers(ctx, scope, loops)
            rv = rank_variance(m, scope)
            bws = A.backward_sites(m, scope)
            for jump in scope.jumps:
                if jump.kind == "raise" or A.single_process_only(m, jump.conds, scope):
                    continue  # a crash stops every rank; `rank == -1` code never runs under DDP
                for loop in loops:
                    if loop not in jump.loops or under_join(m, scope, loop):
                        continue
                    level = jump.loops.index(loop)
                    if jump.kind in ("continue", "break") and jump.loops[-1] is not loop:
                        continue
                    if jump.kind == "continue" and not any(
                            loop in s.loops and s.call.lineno > jump.stmt.lineno for s in bws):
                        continue  # a continue after the backward does not change the number of steps
                    conds = [c for c in jump.conds if c.loop_level > level and _encloses(c.node, jump.stmt)]
                    got = self._reason(ctx, scope, conds, rv) or _data_exception(ctx, scope, jump.stmt, loop, rv)
                    if got is None or not in_ddp_program(m):
                        continue
                    reason, kind = got
                    word = {"continue": "`continue`", "break": "`break`", "return": "`return`",
                            "exit": "exit"}[jump.kind]
                    effect = ("skips this step's backward" if jump.kind == "continue"
                              else "leaves the training loop")
                    ctx.report(
                        self.code, jump.stmt,
                        f"{word} under `{reason}` {effect} on some ranks only: {self._why(reason, kind)} The other "
                        f"ranks still call DDP's gradient all-reduce and wait for it forever (a silent hang), "
                        f"or on gloo average gradients of different steps and fail later.",
                        "Make every rank take the same decision: `if ddp_doctor.fixes.agree(cond, op=\"any\"): "
                        "continue` (for a NaN/Inf loss: `ddp_doctor.fixes.skip_if_nonfinite`); for per-rank "
                        "data of different lengths wrap the loader in `ddp_doctor.fixes.EvenBatches`.",
                    )
                    break

    def _early_return_helpers(self, ctx: Context, scope: Scope, loops: list[ast.stmt]) -> None:
        """``train_step(model, batch, opt)`` in a training loop, where ``train_step`` (this file or another
        project file) returns before its backward under a condition on its batch or loss: reported at the
        call, with the ``return`` as the related location."""
        m = ctx.model
        if m.project is None:
            return
        for site in scope.sites:
            if not any(loop in site.loops for loop in loops):
                continue
            local = m.resolve_function(site.call.func, scope)
            summ = (m.project.summary(m, local) if local is not None
                    else m.project.summary_of_call(m, site.call.func, scope))
            if summ is None or summ.early_return is None or not self._passes_per_rank(ctx, scope, site, summ) or \
                    not in_ddp_program(m):
                continue
            r = summ.early_return
            ctx.report(
                self.code, site.call,
                f"`{ctx.text(site.call.func)}()` skips its backward on some ranks only: it takes {r.message} "
                f"({r.where}), a condition on the batch or the DDP model passed here, so each rank decides from its "
                f"own data (no collective makes the ranks agree). The "
                f"other ranks still call DDP's gradient all-reduce and wait for it forever (a silent hang), or on "
                f"gloo average gradients of different steps and fail later.",
                "Make every rank take the same decision in the helper: `if ddp_doctor.fixes.agree(cond, "
                "op=\"any\"): return` (for a NaN/Inf loss: `ddp_doctor.fixes.skip_if_nonfinite`).",
                related=(r,),
            )

    @staticmethod
    def _passes_per_rank(ctx: Context, scope: Scope, site, summ) -> bool:
        """Does the call pass this rank's own batch or its DDP model where the helper's early return
        depends on it?"""
        m = ctx.model
        rv = rank_variance(m, scope)
        for i, pname in enumerate(summ.params):
            if pname not in summ.early_return_on:
                continue
            arg = arg_or_kw(site.call, i, pname)
            if arg is None:
                continue
            if m.is_ddp_value(arg, scope) or rv.sources(arg) or rv.varying_names(arg, site.stmt):
                return True
        return False

    def _uneven_datasets(self, ctx: Context) -> None:
        """A training loader over a per-rank dataset whose size comes from a per-rank table with unequal
        entries (``SHARD_SIZES[rank]``): the ranks run different numbers of steps."""
        m = ctx.model
        seen = set()
        for use in A.loader_uses(m):
            if not use.training or use.loader in seen or under_join(m, use.scope, use.loop):
                continue
            seen.add(use.loader)
            call = use.loader
            if kwarg(call, "sampler") is not None or kwarg(call, "batch_sampler") is not None:
                continue
            ds = call.args[0] if call.args else (kwarg(call, "dataset").value if kwarg(call, "dataset") else None)
            hit = self._per_rank_table(m, ds, use.loader_scope)
            if hit is None:
                continue
            table, values = hit
            ctx.report(
                self.code, call,
                f"each rank builds its own dataset, sized by the per-rank table `{table}` "
                f"({', '.join(map(str, values))}): the ranks get different numbers of batches, so one leaves the "
                f"loop while the others still call DDP's gradient all-reduce (a hang at the end of the epoch, "
                f"or gradients of different steps averaged on gloo).",
                "Give every rank the same number of batches: wrap the loader in `ddp_doctor.fixes.EvenBatches`, "
                "or split one dataset with `DistributedSampler` (it pads to equal lengths).",
            )

    @staticmethod
    def _per_rank_table(m: ModuleModel, ds, scope: Scope):
        if not isinstance(ds, ast.Call) or not isinstance(ds.func, ast.Name):
            return None
        cls = m.classes.get(ds.func.id)
        if cls is None:
            return None
        init = m.methods.get(cls, {}).get("__init__")
        params = [a.arg for a in init.args.args[1:]] if init is not None else []
        rank_params = {p for i, p in enumerate(params)
                       if i < len(ds.args) and m.mentions_rank(ds.args[i], scope)}
        rank_params |= {k.arg for k in ds.keywords if k.arg and m.mentions_rank(k.value, scope)}
        if not rank_params:
            return None
        attrs = set()
        if init is not None:
            for node in ast.walk(init):
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Name) and node.value.id in rank_params:
                    for t in node.targets:
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            attrs.add(t.attr)
        module_consts = {}
        for stmt in m.tree.body:
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name) \
                    and isinstance(stmt.value, (ast.List, ast.Tuple)):
                vals = [e.value for e in stmt.value.elts if isinstance(e, ast.Constant)]
                if len(vals) == len(stmt.value.elts) and len(set(vals)) > 1:
                    module_consts[stmt.targets[0].id] = vals
        for node in ast.walk(cls):
            if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                    node.value.id in module_consts:
                idx = node.slice
                if (isinstance(idx, ast.Name) and idx.id in rank_params) or (
                        isinstance(idx, ast.Attribute) and isinstance(idx.value, ast.Name) and
                        idx.value.id == "self" and idx.attr in attrs):
                    return node.value.id, module_consts[node.value.id]
        return None

    def _reason(self, ctx: Context, scope: Scope, conds, rv: RankVariance) -> tuple[str, str] | None:
        return varying_reason(ctx.model, scope, conds, rv)

    @staticmethod
    def _why(reason: str, kind: str) -> str:
        if kind == "rank":
            return f"`{reason}` depends on the rank itself."
        if kind == "uneven":
            return "that batch sampler forms each rank's batches from the rank's own shard without padding " \
                   "them to one length, so the ranks run out of batches after different numbers of steps."
        if kind == "exception":
            return f"`{reason}` catches an error raised while this rank loads its own data, which the other " \
                   f"ranks do not see (no collective makes them agree)."
        return f"`{reason}` is computed by each rank from its own batch, loss or clock, so ranks decide differently " \
               f"(no collective makes them agree)."
