"""Order-aware "varies by rank": can a name hold different values on different ranks at a statement?

A value differs between ranks when it comes from the rank's own data or state: a batch (the loop
target over a loader, ``next(it)``), the model's output on it (the loss), the rank's clock, the local
file system (``os.path.exists``), or the rank itself used as data (``shards[rank]``).  It is the same
everywhere when it is a constant, a loop counter, a configuration value, something every rank reads
from the same file, or a value made equal by a collective (``dist.all_reduce(flag)``, ``broadcast``,
``ddp_doctor.fixes.agree``) *before* the statement in question.  So nanoGPT's ``iter_num`` (``0``,
then ``+= 1`` every step) never varies, while ``loss`` always does, and a flag that is all-reduced
varies up to the all_reduce and not after it.

Reaching is by source order with loops taken into account: an assignment reaches a statement when
it comes earlier, or when both are in the same loop (the next iteration sees it).  An agreement kills
the assignments before it for the statements after it.  Conditions are control dependences: a value
assigned under a condition that varies, varies.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from ddp_doctor.lint import analysis as A
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.names import (
    AGREE_FUNCS, GATHER_OUTPUT_COLLECTIVES, INPLACE_COLLECTIVES, data_names, dotted, final_name,
)
from ddp_doctor.lint.scopes import Cond, Scope

_CLOCKS = {"time.time", "time.perf_counter", "time.monotonic", "time.time_ns", "time.perf_counter_ns",
           "time.monotonic_ns", "datetime.datetime.now", "datetime.now", "time.process_time"}
# the local file system: node-local disks, files appearing while others read, per-rank outputs
_FS_PROBES = {"os.path.exists", "os.path.isfile", "os.path.isdir", "os.path.getsize", "os.path.getmtime",
              "os.listdir", "os.scandir", "glob.glob", "glob.iglob", "os.stat"}
_FS_METHODS = {"exists", "is_file", "is_dir", "stat", "iterdir", "glob", "rglob"}
# iterating these is walking configuration, not data
_CONFIG_ITER_METHODS = {"items", "keys", "values", "parameters", "named_parameters", "modules", "named_modules",
                        "children", "named_children", "buffers", "named_buffers", "state_dict"}
_RANGE_LIKE = {"range", "trange"}


def has_collective(m: ModuleModel, node: ast.AST, scope: Scope) -> bool:
    """Does ``node`` call a collective (directly, through ddp_doctor.fixes, or a same-file helper)?"""
    for c in ast.walk(node):
        if isinstance(c, ast.Call):
            if m.collective_name(c, scope) or final_name(c.func) in AGREE_FUNCS or \
                    final_name(c.func) in ("skip_if_nonfinite",):
                return True
            fn = m.resolve_function(c.func, scope)
            if fn is not None and A.fn_collectives(m, fn):
                return True
            if m.project_collectives(c.func, scope):
                return True
            if _from_fixes(m, c.func, scope):
                return True  # ddp_doctor.fixes: agree, skip_if_nonfinite, EarlyStopping.step, ...
    return False


def _from_fixes(m: ModuleModel, func: ast.expr, scope: Scope) -> bool:
    q = m.qual(func) or ""
    if q.startswith("ddp_doctor.fixes"):
        return True
    if isinstance(func, ast.Attribute):  # stopper.step(val_loss) with stopper = EarlyStopping(...)
        for v in m.values_of(func.value, scope):
            if isinstance(v, ast.Call) and (m.qual(v.func) or "").startswith("ddp_doctor.fixes"):
                return True
    return False


_PASS_THROUGH = ("enumerate", "tqdm", "zip", "iter", "list", "sorted", "reversed")


def _unwrapped(it: ast.expr) -> ast.expr:
    while isinstance(it, ast.Call) and final_name(it.func) in _PASS_THROUGH and it.args:
        it = it.args[0]
    return it


def _counter(it: ast.expr, values, depth: int = 0) -> bool:
    """``pbar`` with ``pbar = range(n)``, then ``pbar = tqdm(pbar)`` on rank 0 only: the same counter
    on every rank (a progress bar yields what it wraps)."""
    it = _unwrapped(it)
    if isinstance(it, ast.Call):
        return final_name(it.func) in _RANGE_LIKE
    if not isinstance(it, ast.Name) or values is None or depth > 3:
        return False
    vals = [v for v in values(it) if not (isinstance(_unwrapped(v), ast.Name) and _unwrapped(v).id == it.id)]
    return bool(vals) and all(_counter(v, values, depth + 1) for v in vals)


def iterates_data(loop: ast.stmt, values=None) -> bool:
    """Does this ``for`` walk data (a loader, a dataset, a list of batches) rather than a counter or a
    configuration (``range``, a literal list, ``dict.items()``, ``model.parameters()``)?  ``values``:
    what a name was assigned (to see a counter behind a name)."""
    if not isinstance(loop, (ast.For, ast.AsyncFor)):
        return False
    it = _unwrapped(loop.iter)
    if _counter(it, values):
        return False
    if isinstance(it, (ast.List, ast.Tuple, ast.Set, ast.Dict, ast.Constant, ast.JoinedStr)):
        return False
    if isinstance(it, ast.Call):
        name = final_name(it.func)
        if name in _RANGE_LIKE or name in _CONFIG_ITER_METHODS:
            return False
    if isinstance(it, ast.Attribute) and it.attr in ("param_groups", "defaults"):
        return False
    return not _walks_keys(loop, it) and not _configuration(it, values)


_PARSED_FILES = {"load", "loads", "safe_load", "full_load"}  # json / yaml / toml / tomllib


def _configuration(it: ast.expr, values) -> bool:
    """``for concept in args.concepts_list`` where the list is a literal or parsed from a JSON / YAML / TOML file:
    a configuration every rank holds alike (each rank reads the same file), not a stream of this rank's data."""
    if values is None or not isinstance(it, (ast.Name, ast.Attribute)):
        return False
    vals = [v for v in values(it) if not any(n is it for n in ast.walk(v))]
    return bool(vals) and all(
        isinstance(v, (ast.List, ast.Tuple, ast.Dict, ast.Set)) or (
            isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute) and v.func.attr in _PARSED_FILES and
            isinstance(v.func.value, ast.Name) and v.func.value.id in ("json", "yaml", "toml", "tomllib"))
        for v in vals)


def _walks_keys(loop: ast.stmt, it: ast.expr) -> bool:
    """``for split in raw_datasets: raw_datasets[split] = ...``: the body indexes what it iterates with the
    loop's target, so these are a mapping's keys (the split names), the same on every rank, as ``.keys()``."""
    d = dotted(it)
    if not d or not isinstance(loop.target, ast.Name):
        return False
    return any(isinstance(n, ast.Subscript) and dotted(n.value) == d and isinstance(n.slice, ast.Name)
               and n.slice.id == loop.target.id for st in loop.body for n in ast.walk(st))


def loop_data_names(loop: ast.stmt, values=None) -> set[str]:
    """Names bound to the *data* of a for loop (not ``enumerate``'s counter, not ``range``)."""
    if not iterates_data(loop, values):
        return set()
    target = loop.target
    if _enumerates(loop.iter, values) and isinstance(target, (ast.Tuple, ast.List)) and target.elts:
        target = ast.Tuple(elts=target.elts[1:])
    return {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}


def _enumerates(it: ast.expr, values, depth: int = 0) -> bool:
    """``enumerate(loader)``, also behind a progress bar and a name bound to either on each branch (Lightning's
    ``iterable = tqdm(enumerate(dl)) if fabric.is_global_zero else enumerate(dl)``): the first item is a counter."""
    while isinstance(it, ast.Call) and final_name(it.func) in ("tqdm", "iter") and it.args:
        it = it.args[0]
    if isinstance(it, ast.Call):
        return final_name(it.func) == "enumerate"
    if isinstance(it, ast.IfExp):
        return _enumerates(it.body, values, depth + 1) and _enumerates(it.orelse, values, depth + 1)
    if not isinstance(it, ast.Name) or values is None or depth > 3:
        return False
    vals = [v for v in values(it) if not any(n is it for n in ast.walk(v))]
    return bool(vals) and all(_enumerates(v, values, depth + 1) for v in vals)


@dataclass(eq=False)
class Binding:
    """One assignment of ``name``: ``value`` (None for a loop's data target, which always varies)."""

    name: str
    value: ast.expr | None
    stmt: ast.stmt
    conds: tuple[Cond, ...]
    loops: tuple[ast.stmt, ...]


def _line(stmt: ast.AST) -> tuple[int, int]:
    return stmt.lineno, stmt.col_offset


class RankVariance:
    """Which names vary by rank where, in one scope (see the module docstring)."""

    def __init__(self, m: ModuleModel, scope: Scope, per_rank_params: frozenset[str] = frozenset()):
        """``per_rank_params``: parameters taken to hold this rank's own data (a helper's batch) or model
        (its output varies), for a summary that asks "what if the caller passes such a value?"."""
        self.m = m
        self.scope = scope
        self.models = per_rank_params
        self.where: dict[int, tuple[tuple[Cond, ...], tuple[ast.stmt, ...]]] = {}
        self.bindings: dict[str, list[Binding]] = {}
        for p in per_rank_params:  # bound on entry, before every statement of the body
            self.bindings.setdefault(p, []).append(Binding(p, None, scope.node, (), ()))
        self.agreed: dict[str, list[tuple[ast.stmt, tuple[ast.stmt, ...]]]] = {}
        self.keys: dict[str, set[str]] = {}  # a dict's name -> its entries assigned by a constant key
        for stmt, conds, loops in scope.stmts:
            self.where[id(stmt)] = (conds, loops)
            self._collect(stmt, conds, loops)
        for site in scope.sites:
            name = m.collective_name(site.call, scope)
            op = name.split(".")[-1] if name else None
            if name and op in INPLACE_COLLECTIVES | GATHER_OUTPUT_COLLECTIVES and site.call.args:
                d = dotted(site.call.args[0])  # all_reduce(flag) / all_gather(out, t): the same everywhere after
                if d:
                    self.agreed.setdefault(d.split(".")[0], []).append((site.stmt, site.loops))
        self.varying: set[int] = set()
        self._solve()

    # ------------------------------------------------------------ bindings
    def _collect(self, stmt: ast.stmt, conds, loops) -> None:
        def bind(target: ast.expr, value: ast.expr | None) -> None:
            if isinstance(target, (ast.Tuple, ast.List)) and isinstance(value, (ast.Tuple, ast.List)) and \
                    len(target.elts) == len(value.elts) and not any(isinstance(e, ast.Starred) for e in target.elts):
                for t, v in zip(target.elts, value.elts):  # `state["epoch"], state["step"] = epoch + 1, 0`
                    bind(t, v)
                return
            key = key_name(target)
            if key is not None:  # `state["loss_sum"] += loss.item()` varies that entry, not `state["step"]`
                self.bindings.setdefault(key, []).append(Binding(key, value, stmt, conds, loops))
                self.keys.setdefault(key.split("[", 1)[0], set()).add(key)
                return
            for n in ast.walk(target):
                if isinstance(n, ast.Name):
                    self.bindings.setdefault(n.id, []).append(Binding(n.id, value, stmt, conds, loops))

        if isinstance(stmt, ast.Assign):
            for t in stmt.targets:
                bind(t, stmt.value)
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None:
            bind(stmt.target, stmt.value)
        elif isinstance(stmt, ast.AugAssign):
            bind(stmt.target, ast.BinOp(left=stmt.target, op=stmt.op, right=stmt.value))
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            def values(e: ast.expr) -> list[ast.expr]:
                return self.m.values_of(e, self.scope)

            data = loop_data_names(stmt, values)
            inner = loops + (stmt,)
            for n in ast.walk(stmt.target):
                if isinstance(n, ast.Name):
                    if n.id in data:
                        value = None
                    elif _counter(stmt.iter, values) or (isinstance(stmt.iter, ast.Call) and
                                                         not iterates_data(stmt, values)):
                        value = ast.Constant(0)
                    else:
                        value = stmt.iter
                    self.bindings.setdefault(n.id, []).append(Binding(n.id, value, stmt, conds, inner))
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    bind(item.optional_vars, item.context_expr)
        elif isinstance(stmt, ast.Expr):
            for n in ast.walk(stmt.value):  # walrus: `if (batch := next(it)) is None`
                if isinstance(n, ast.NamedExpr):
                    bind(n.target, n.value)
        if isinstance(stmt, (ast.If, ast.While)):
            for n in ast.walk(stmt.test):
                if isinstance(n, ast.NamedExpr):
                    bind(n.target, n.value)

    # ------------------------------------------------------------- reaching
    def _reaches(self, b: Binding, stmt: ast.stmt, loops: tuple[ast.stmt, ...]) -> bool:
        """Does assignment ``b`` reach ``stmt`` on some path that no agreement on its name cuts?"""
        if b.stmt is stmt:
            return False
        kills = self.agreed.get(b.name.split("[", 1)[0], ())
        lb, lp = _line(b.stmt), _line(stmt)
        # straight down: b, then stmt, with no agreement and no reassignment on every path in between
        if lb < lp:
            return not any(lb < _line(c) < lp for c, _l in kills) and not self._overwritten(b, stmt, loops)
        # around a loop holding both: b to the loop's end, then its start to stmt
        shared = set(b.loops) & set(loops)
        if not shared:
            return False
        return not any(set(c_loops) & shared and (_line(c) > lb or _line(c) < lp) for c, c_loops in kills)

    def _overwritten(self, b: Binding, stmt: ast.stmt, loops: tuple[ast.stmt, ...]) -> bool:
        """Is ``b``'s name assigned again on every path from ``b`` down to ``stmt``?  An assignment between them
        that runs whenever ``stmt`` does (no condition that ``stmt`` is not under, no loop it is not in), or the
        branches of an ``if``/``else`` that each assign it (``repo_id`` set on rank 0 for a hub upload, then set
        in both branches before the labels are read)."""
        lb, lp = _line(b.stmt), _line(stmt)
        at = {(id(c.node), c.positive) for c in self.where.get(id(stmt), ((), ()))[0]}
        paths: set[frozenset] = set()
        for k in self.bindings.get(b.name, ()):
            if lb < _line(k.stmt) < lp and set(k.loops) <= set(loops) and k.stmt is not stmt:
                paths.add(frozenset((id(c.node), c.positive) for c in k.conds if c.node is not k.stmt) - at)
        while paths and frozenset() not in paths:
            merged = {p - {x} for p in paths for q in paths for x in p if (x[0], not x[1]) in q
                      and p - {x} == q - {(x[0], not x[1])}}
            if merged <= paths:
                return False
            paths |= merged
        return bool(paths)

    def varying_binding(self, name: str, stmt: ast.stmt) -> Binding | None:
        """The assignment that makes ``name`` differ between ranks at ``stmt``, if any."""
        _conds, loops = self.where.get(id(stmt), ((), ()))
        if isinstance(stmt, (ast.For, ast.AsyncFor, ast.While)):
            loops = loops + (stmt,)
        # an entry (`state['step']`) is also what the whole dict was assigned; the whole dict is each entry too
        names = [name, name.split("[", 1)[0]] if "[" in name else [name, *sorted(self.keys.get(name, ()))]
        for n in names:
            for b in self.bindings.get(n, ()):
                if id(b) in self.varying and self._reaches(b, stmt, loops):
                    return b
        return None

    # ------------------------------------------------------------- solving
    def _solve(self) -> None:
        all_b = [b for bs in self.bindings.values() for b in bs]
        changed, rounds = True, 0
        while changed and rounds < 8:
            changed, rounds = False, rounds + 1
            for b in all_b:
                if id(b) not in self.varying and self._binding_varies(b):
                    self.varying.add(id(b))
                    changed = True

    def _binding_varies(self, b: Binding) -> bool:
        if b.value is None:
            return True  # a loop over this rank's data
        if self.expr_varies(b.value, b.stmt, before_loops=self._before_loops(b)):
            return True
        return any(self.test_varies(c) for c in b.conds if c.node is not b.stmt)

    def _before_loops(self, b: Binding) -> bool:
        """``b`` is set up before the loops of its function run (outside every loop, above one): what it reads
        from the file system is read once at start, where every rank finds the same files (the newest
        checkpoint directory to resume from); read inside the loop, files appear while others read."""
        return not b.loops and any(_line(loop) > _line(b.stmt) for loop, _c, _l in self.scope.loops)

    def test_varies(self, c: Cond) -> bool:
        return self.m.is_rank_condition(c.test, self.scope) or self.expr_varies(c.test, c.node)

    def expr_varies(self, expr: ast.expr, stmt: ast.stmt, before_loops: bool = False) -> bool:
        # read once before the loops: the files every rank finds, a sample batch for shapes
        found = [s for s in self.sources(expr) if not (before_loops and s in ("file system", "batch"))]
        return bool(found or self.varying_names(expr, stmt)) and not has_collective(self.m, expr, self.scope)

    def varying_names(self, expr: ast.expr, stmt: ast.stmt) -> set[str]:
        return {n for n in keyed_data_names(expr) if self.varying_binding(n, stmt) is not None}

    def sources(self, expr: ast.expr) -> list[str]:
        """What in ``expr`` itself differs between ranks: 'batch', 'clock', 'file system', 'model output',
        'rank'."""
        m, scope = self.m, self.scope
        out = []
        for c in ast.walk(expr):
            if not isinstance(c, ast.Call):
                continue
            q = m.qual(c.func) or ""
            name = final_name(c.func)
            if name == "next":
                if not _first_of_container(c):
                    out.append("batch")
            elif q in _CLOCKS:
                out.append("clock")  # each rank reads its own clock: a time budget is a rank-local decision
            elif q in _FS_PROBES or (isinstance(c.func, ast.Attribute) and name in _FS_METHODS and not q
                                     and not c.args and not c.keywords):
                out.append("file system")
            else:
                tgt = A.forward_target(c)
                if tgt is not None:
                    if isinstance(tgt, ast.Attribute) and tgt.attr == "module":
                        tgt = tgt.value  # model.module(x): the rank's own forward, too
                    if m.is_ddp_value(tgt, scope) or (isinstance(tgt, ast.Name) and tgt.id in self.models):
                        out.append("model output")
        if not isinstance(expr, ast.Constant) and m.varies_by_rank(expr, scope):
            out.append("rank")
        return out


def key_name(node: ast.AST) -> str | None:
    """``state["epoch_step"]`` -> ``"state['epoch_step']"``: one entry of a dict (or list) read or assigned by a
    constant key, which the analysis keeps apart from the others."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
            isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, (str, int)):
        return f"{node.value.id}[{node.slice.value!r}]"
    return None


def keyed_data_names(expr: ast.expr) -> set[str]:
    """:func:`data_names`, with a dict read only by constant keys named by those entries."""
    names = data_names(expr)
    keyed: dict[str, set[str]] = {}
    bases: set[int] = set()
    for n in ast.walk(expr):
        k = key_name(n)
        if k is not None and n.value.id in names:
            keyed.setdefault(n.value.id, set()).add(k)
            bases.add(id(n.value))
    for base, keys in keyed.items():
        names |= keys
        if all(id(n) in bases for n in ast.walk(expr) if isinstance(n, ast.Name) and n.id == base):
            names.discard(base)
    return names


def _first_of_container(call: ast.Call) -> bool:
    """``next(iter(d.values()))`` / ``next(iter([...]))``: the first entry of a container (the HF idiom
    ``next(iter(raw_datasets.values())).features``), not the rank's next batch."""
    arg = call.args[0] if call.args else None
    if isinstance(arg, ast.Call) and final_name(arg.func) == "iter" and arg.args:
        arg = arg.args[0]
    return isinstance(arg, (ast.List, ast.Tuple, ast.Dict, ast.Set)) or (
        isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr in ("values", "keys",
                                                                                            "items"))


def rank_variance(m: ModuleModel, scope: Scope) -> RankVariance:
    key = ("rank_variance", scope.node)
    got = m._cache.get(key)
    if got is None:
        got = m._cache[key] = RankVariance(m, scope)
    return got
