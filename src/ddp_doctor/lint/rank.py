"""Rank dependence: is a condition's truth different on different ranks, does a value carry the
rank, which arguments of a function's callers are rank-valued."""
from __future__ import annotations

import ast
import itertools
from typing import Any, Iterable, Iterator

from ddp_doctor.lint.evaluate import RANKS, _DOMAIN, _MAX_ATOMS, _Eval, _Unknown
from ddp_doctor.lint.names import arg_or_kw, dotted
from ddp_doctor.lint.scopes import Cond, Scope


class RankDependence:
    """Mixin of :class:`~ddp_doctor.lint.model.ModuleModel`: rank conditions and rank-valued data."""

    def rank_truths(self, expr: ast.expr, scope: Scope, sigma: dict[str, Any]) -> list[str] | None:
        """Truth of ``expr`` on ranks 0..3 under one choice of the unknowns: 'T', 'F' or '?'."""
        out = []
        for r in RANKS:
            try:
                vals = _Eval(self, scope, r, sigma).ev(expr, 0)
            except _Unknown:
                return None
            except Exception:  # noqa: BLE001 - an evaluation that cannot be done is "unknown"
                return None
            truths = set()
            for v in vals:
                try:
                    truths.add(bool(v))
                except Exception:  # noqa: BLE001
                    return None
            out.append("T" if truths == {True} else "F" if truths == {False} else "?")
        return out

    def varies_by_rank(self, expr: ast.expr, scope: Scope) -> bool:
        """Can the *value* of ``expr`` differ between ranks?  ``shards[rank]``, ``f"out{rank}"`` and
        ``rank == 0`` can; ``int(os.environ["RANK"]) != -1`` and ``world_size`` mention the rank yet are
        the same everywhere.  Shown by evaluating ``expr`` for every rank; a value that mentions the rank
        and cannot be evaluated (``load_shard(rank)``) counts as varying."""
        key = ("varies", id(expr), id(scope))
        got = self._cache.get(key)
        if got is not None and got[0] is expr:
            return got[1]
        res = False
        if self.mentions_rank(expr, scope):
            any_eval = False
            for sigma in self.sigmas(self.atoms(expr, scope), [expr]):
                try:
                    vals = [_Eval(self, scope, r, sigma).ev(expr, 0) for r in RANKS]
                except Exception:  # noqa: BLE001 - cannot be evaluated under this choice
                    continue
                any_eval = True
                if any(v != vals[0] for v in vals):
                    res = True
                    break
            res = res or not any_eval
        self._cache[key] = (expr, res)
        return res

    def atoms(self, expr: ast.expr, scope: Scope) -> list[str]:
        ev = _Eval(self, scope, 0, {}, collect=True)
        try:
            ev.ev(expr, 0)
        except Exception:  # noqa: BLE001
            pass
        return ev.atoms

    def mentions_rank(self, expr: ast.expr, scope: Scope) -> bool:
        key = ("mentions", id(expr), id(scope))
        got = self._cache.get(key)
        if got is not None and got[0] is expr:
            return got[1]
        ev = _Eval(self, scope, 0, {}, collect=True)
        try:
            ev.ev(expr, 0)
        except Exception:  # noqa: BLE001
            pass
        self._cache[key] = (expr, ev.hit)  # holding expr keeps its id from being reused
        return ev.hit

    def rank_origin(self, expr: ast.expr, scope: Scope) -> tuple[str, int] | None:
        """Where the rank that ``expr`` reads enters from another file (a caller passing it, a helper
        returning it): (path, line), or None when it is read here."""
        ev = _Eval(self, scope, 0, {}, collect=True)
        try:
            ev.ev(expr, 0)
        except Exception:  # noqa: BLE001
            pass
        return next((o for o in ev.origins if o[0] != self.path), None) if ev.hit else None

    def atom_key(self, node: ast.AST) -> str:
        d = dotted(node)
        if d is not None:
            return d
        key = ("dump", id(node))
        got = self._cache.get(key)
        if got is not None and got[0] is node:
            return got[1]
        text = ast.dump(node)
        self._cache[key] = (node, text)
        return text

    def sigmas(self, atoms: list[str], exprs: Iterable[ast.AST] = ()) -> Iterator[dict[str, Any]]:
        """Values to try for the unknowns: a few small ones, plus the integers the conditions compare with
        (so `step % 4 == 3` can be true).  Past the first few unknowns every combination is not tried:
        the others take a value that changes from one try to the next.  Any choice is a legal one (an
        unknown is the same on every rank), and leaving one without a value would make a condition that
        reads many counters (``update_idx % log_interval == 0 or last_batch``) look rank-dependent only
        because it could not be evaluated."""
        first, rest = atoms[:_MAX_ATOMS], atoms[_MAX_ATOMS:]
        domain = list(_DOMAIN)
        for e in exprs:
            for n in ast.walk(e):
                if isinstance(n, ast.Constant) and type(n.value) is int and n.value not in domain and \
                        len(domain) < 8:
                    domain.append(n.value)
        for i, combo in enumerate(itertools.product(domain, repeat=len(first))):
            sigma = dict(zip(first, combo))
            for j, a in enumerate(rest):
                sigma[a] = domain[(i + j + 1) % len(domain)]
            yield sigma

    def is_rank_condition(self, expr: ast.expr, scope: Scope) -> bool:
        key = ("rankcond", id(expr), id(scope))
        if key in self._cache:
            return self._cache[key]
        res = False
        if self.mentions_rank(expr, scope):
            atoms = self.atoms(expr, scope)
            any_eval = False
            for sigma in self.sigmas(atoms, [expr]):
                t = self.rank_truths(expr, scope, sigma)
                if t is None:
                    continue
                any_eval = True
                if len(set(t)) > 1:
                    res = True
                    break
            if not any_eval:
                res = True  # mentions the rank and cannot be shown constant
            if not res and isinstance(expr, ast.BoolOp) and isinstance(expr.op, ast.And):
                # `... and cur_tick != 0 and dist.get_rank() == 0`: too many unknowns for the tries to meet the
                # case where the others hold, but the conjunct alone already makes ranks decide differently
                res = any(self.is_rank_condition(v, scope) for v in expr.values)
        self._cache[key] = res
        return res

    def rank_param_args(self, scope: Scope, name: str) -> list[tuple[ast.expr, Scope]] | str | None:
        """The arguments the same-file callers pass for parameter ``name`` of ``scope``'s function, when
        at least one of them carries the rank (``main(rank, ...)`` -> ``Trainer(model, rank)``); else None.
        "spawn" for the first parameter of an ``mp.spawn`` target (the process index: the local rank).
        Followed one level: the callers' own parameters are not traced back further."""
        key = ("rankparam", id(scope), name)
        if key in self._cache:
            return self._cache[key]
        self._cache[key] = None  # recursion guard
        res = None
        fn = scope.node
        a = getattr(fn, "args", None)
        if a is not None and name not in (getattr(a.vararg, "arg", None), getattr(a.kwarg, "arg", None)):
            idx = scope.params.index(name)
            if scope.cls is not None and a.args and a.args[0].arg in ("self", "cls"):
                idx -= 1
            if name in [x.arg for x in a.kwonlyargs]:
                idx = 1 << 20  # keyword only
            if idx == 0 and self._spawn_target(fn):
                self._cache[key] = "spawn"  # mp.spawn(main_worker, ...): the first argument is the process index
                return "spawn"
            sites = self.call_sites_of(fn) if idx >= 0 else []
            got = []
            for site in sites[:8]:
                arg = arg_or_kw(site.call, idx, name)
                if arg is not None and site.scope is not scope:
                    got.append((arg, site.scope))
            if not sites and idx >= 0 and self.project is not None:
                # no caller here: the callers in the project's other files (not cached on this model:
                # they hold other models, which the project may release between files)
                res = self._rank_args(self.project.caller_args(self, fn, idx, name))
                del self._cache[key]  # (the recursion guard)
                return res
            res = self._rank_args(got)
        self._cache[key] = res
        return res

    @staticmethod
    def _rank_args(got: list) -> list | None:
        """``got`` when one of its (argument, scope) pairs carries the rank, else None."""
        return got if got and any(sc.module._mentions_rank_shallow(arg, sc) for arg, sc in got) else None

    def _spawn_target(self, fn: ast.AST) -> bool:
        """``fn`` is started by ``torch.multiprocessing.spawn(fn, ...)`` (or ``start_processes``), which
        passes the process index (the local rank) as its first argument."""
        name = getattr(fn, "name", None)
        if name is None or self.def_parent.get(fn) is not self.tree:
            return False
        targets = self._cache.get("spawn_targets")
        if targets is None:
            targets = set()
            for site in self._sites_named("spawn") + self._sites_named("start_processes"):
                q = self.qual(site.call.func) or ""
                target = arg_or_kw(site.call, 0, "fn")
                if "multiprocessing" in q and isinstance(target, ast.Name):
                    targets.add(target.id)
            self._cache["spawn_targets"] = targets
        return name in targets

    def _mentions_rank_shallow(self, expr: ast.expr, scope: Scope) -> bool:
        """Does ``expr`` carry the rank without looking through the caller's own parameters?"""
        ev = _Eval(self, scope, 0, {}, collect=True)
        ev.no_params = True
        try:
            ev.ev(expr, 0)
        except Exception:  # noqa: BLE001
            pass
        return ev.hit

    def rank_conds(self, conds: Iterable[Cond], scope: Scope) -> list[Cond]:
        return [c for c in conds if self.is_rank_condition(c.test, scope)]
