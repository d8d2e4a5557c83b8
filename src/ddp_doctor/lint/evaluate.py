"""The evaluator behind rank conditions: an expression evaluated for one rank of a world of 4, to
the set of values it can take, with rank-independent unknowns given by ``sigma``."""
from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Any

from ddp_doctor.lint.names import (
    WORLD, _RANK_ENV, _WORLD_ENV, _WORLD_NAMES, dotted, final_name, is_main_name, is_rank_name, non_data_args,
)
from ddp_doctor.lint.scopes import Scope

if TYPE_CHECKING:
    from ddp_doctor.lint.model import ModuleModel

RANKS = range(WORLD)
NODE_SIZE = 2  # ranks per node in the evaluated world: 2 nodes of 2


def rank_kind(name: str) -> str:
    """'local' for a rank within its node (``local_rank``, ``LOCAL_RANK``, ``SLURM_LOCALID``,
    ``get_node_local_rank``, ``is_local_main_process``), 'node' for a node index (``node_rank``,
    ``GROUP_RANK``), 'global' otherwise."""
    low = name.lower()
    if "local" in low:
        return "local"
    if low in ("node_rank", "group_rank", "get_node_rank") or low.endswith("node_rank"):
        return "node"
    return "global"


class _Unknown(Exception):
    pass


# Values tried for rank-independent unknowns (the same on every rank).
_DOMAIN = (None, 0, 1, 2)
_MAX_ATOMS = 3


class _Eval:
    """Evaluates an expression for one rank to a set of possible concrete values."""

    def __init__(self, model: ModuleModel, scope: Scope, rank: int, sigma: dict[str, Any], collect: bool = False):
        self.m = model
        self.scope = scope
        self.r = rank
        self.sigma = sigma
        self.collect = collect
        self.atoms: list[str] = []
        self.hit = False
        self.visiting: set = set()
        self.no_params = False  # parameters stay unknowns (no look at the callers)
        self.origins: list[tuple[str, int]] = []  # (path, line) where the rank entered from another file

    def atom(self, node: ast.AST) -> set:
        key = self.m.atom_key(node)
        if self.collect:
            if key not in self.atoms:
                self.atoms.append(key)
            return {0}
        if key in self.sigma:
            return {self.sigma[key]}
        raise _Unknown

    def rank(self, kind: str = "global") -> set:
        """The rank of this evaluation: global, ``local`` (within its node) or the ``node`` index.
        The world of 4 is 2 nodes of 2 GPUs, so ``local_rank == 0`` holds on ranks 0 and 2 (once per
        node) and ``rank == 0`` on rank 0 only (once per job)."""
        self.hit = True
        if kind == "local":
            return {self.r % NODE_SIZE}
        if kind == "node":
            return {self.r // NODE_SIZE}
        return {self.r}

    def main(self, kind: str = "global") -> set:
        self.hit = True
        return {(self.r % NODE_SIZE if kind == "local" else self.r) == 0}

    def ev(self, node: ast.AST, depth: int) -> set:
        if depth > 12:
            raise _Unknown
        m = self.m
        if isinstance(node, ast.Constant):
            return {node.value}
        if isinstance(node, ast.Name):
            n = node.id
            if is_rank_name(n):
                return self.rank(rank_kind(n))
            if is_main_name(n):
                return self.main(rank_kind(n))
            if n in _WORLD_NAMES:
                return {WORLD}
            if n in ("True", "False", "None"):
                return {eval(n)}  # noqa: S307 - py<3.8 style names only
            return self._assigned(node, depth)
        if isinstance(node, ast.Attribute):
            a = node.attr
            q = m.qual(node)
            if q in ("os.environ",):
                return self.atom(node)
            if is_rank_name(a) or a in ("global_rank", "local_rank", "node_rank", "process_index",
                                        "local_process_index"):
                return self.rank(rank_kind(a))
            if is_main_name(a):
                return self.main(rank_kind(a))
            if a in _WORLD_NAMES:
                return {WORLD}
            d = dotted(node)
            if d and m.values_of(node, self.scope):
                return self._assigned(node, depth)
            return self.atom(node)
        if isinstance(node, ast.Subscript):
            envkey = self._env_key(node)
            if envkey is not None:
                return self._env(envkey)
            before = self.hit
            self.hit = False
            idx = self.ev(node.slice, depth + 1)
            idx_rank, self.hit = self.hit, before or self.hit
            n_atoms = len(self.atoms)
            try:
                base = self.ev(node.value, depth + 1)
                out = set()
                for b in base:
                    for i in idx:
                        out.add(b[i])
                return out
            except Exception:  # noqa: BLE001
                if self.collect:
                    del self.atoms[n_atoms:]  # the element is the unknown, not its container
                if idx_rank and not self.collect:
                    raise _Unknown from None  # SHARDS[rank::world]: depends on the rank
                return self.atom(node)  # an element of unknown data: the same on every rank
        if isinstance(node, ast.Call):
            return self._call(node, depth)
        if isinstance(node, ast.Slice):  # ds[rank::world]: a rank in a slice selects per-rank data
            parts = [self.ev(x, depth + 1) if x is not None else {None} for x in (node.lower, node.upper, node.step)]
            return {("slice", a, b, c) for a in parts[0] for b in parts[1] for c in parts[2]}
        if isinstance(node, ast.UnaryOp):
            vals = self.ev(node.operand, depth + 1)
            op = node.op
            if isinstance(op, ast.Not):
                return {not v for v in vals}
            if isinstance(op, ast.USub):
                return {-v for v in vals}
            if isinstance(op, ast.UAdd):
                return {+v for v in vals}
            return {~v for v in vals}
        if self.collect and isinstance(node, (ast.BoolOp, ast.BinOp, ast.Compare)):
            # every operand's unknowns, even where the stand-in values fail (`step // accum` is 0 // 0)
            for v in ast.iter_child_nodes(node):
                if isinstance(v, ast.expr):
                    try:
                        self.ev(v, depth + 1)
                    except Exception:  # noqa: BLE001
                        pass
            return {0}
        if isinstance(node, ast.BoolOp):
            results: set = set()
            is_and = isinstance(node.op, ast.And)
            for i, v in enumerate(node.values):
                vals = self.ev(v, depth + 1)
                last = i == len(node.values) - 1
                cont = False
                for x in vals:
                    if last or (bool(x) if is_and else not bool(x)):
                        if last:
                            results.add(x)
                        else:
                            cont = True
                    else:
                        results.add(x)
                if not cont:
                    break
            return results
        if isinstance(node, ast.Compare):
            left = self.ev(node.left, depth + 1)
            result = {True}
            cur = left
            for op, comp in zip(node.ops, node.comparators):
                right = self.ev(comp, depth + 1)
                step = set()
                for a in cur:
                    for b in right:
                        step.add(_cmp(op, a, b))
                result = {x and y for x in result for y in step}
                cur = right
            return result
        if isinstance(node, ast.BinOp):
            left = self.ev(node.left, depth + 1)
            right = self.ev(node.right, depth + 1)
            out = set()
            for a in left:
                for b in right:
                    out.add(_binop(node.op, a, b))
            return out
        if isinstance(node, ast.IfExp):
            return self.ev(node.body, depth + 1) | self.ev(node.orelse, depth + 1)
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            elts = [self.ev(e, depth + 1) for e in node.elts]
            if all(len(e) == 1 for e in elts):
                return {tuple(next(iter(e)) for e in elts)}
            raise _Unknown
        if isinstance(node, ast.JoinedStr):
            for v in node.values:  # f"ckpt-rank{rank}.pt": depends on the rank
                if isinstance(v, ast.FormattedValue):
                    try:
                        self.ev(v.value, depth + 1)
                    except Exception:  # noqa: BLE001
                        pass
            if self.hit and not self.collect:
                raise _Unknown
            return self.atom(node)
        return self.atom(node)

    def _assigned(self, node: ast.expr, depth: int) -> set:
        vals = self.m.values_of(node, self.scope)
        key = (dotted(node), id(self.scope))
        if not vals and isinstance(node, ast.Name) and node.id in self.scope.params and not self.no_params and \
                key not in self.visiting:
            return self._param(node, depth)
        if not vals or len(vals) > 4 or key in self.visiting:
            return self.atom(node)
        # (self.gpu_id = gpu_id in __init__: the value is read in the method that assigned it)
        return self._union([(v, self.m.scope_of_value(v, self.scope)) for v in vals], key, depth)

    def _union(self, exprs: list[tuple[ast.expr, "Scope"]], key: tuple, depth: int) -> set:
        """The values ``exprs`` can take, each evaluated in its own scope (``key`` guards recursion)."""
        self.visiting.add(key)
        try:
            out: set = set()
            for v, vscope in exprs:
                if vscope is self.scope:
                    out |= self.ev(v, depth + 1)
                else:
                    sub = self._sub(vscope)
                    out |= sub.ev(v, depth + 1)
                    self._note(sub, v)
        finally:
            self.visiting.discard(key)
        if len(out) > 16:
            raise _Unknown
        return out

    def _sub(self, scope: "Scope", collect: bool | None = None) -> "_Eval":
        # scope.module: a caller's argument is evaluated in its own file's model
        sub = _Eval(scope.module, scope, self.r, self.sigma, self.collect if collect is None else collect)
        if collect is None:
            sub.atoms = self.atoms
        sub.visiting = self.visiting
        sub.no_params = self.no_params
        sub.origins = self.origins
        return sub

    def _note(self, sub: "_Eval", where: ast.AST) -> None:
        """``sub`` evaluated a value: its rank is ours, and where it came from when in another file."""
        if sub.hit and sub.m is not self.m and not self.hit:
            self.origins.append((sub.m.path, where.lineno))
        self.hit = self.hit or sub.hit

    def _param(self, node: ast.Name, depth: int) -> set:
        """A parameter that the same-file callers fill with the rank (``Trainer(model, rank)`` ->
        ``__init__(self, model, gpu_id)``): one level, and only when some call passes a rank-valued
        argument; otherwise the parameter stays an unknown, the same on every rank."""
        m, scope = self.m, self.scope
        args = m.rank_param_args(scope, node.id)
        if args == "spawn":
            return self.rank()
        if not args:
            return self.atom(node)
        return self._union(list(args), (node.id, id(scope)), depth)

    def _env_key(self, node: ast.Subscript) -> str | None:
        if self.m.qual(node.value) == "os.environ" and isinstance(node.slice, ast.Constant):
            return str(node.slice.value)
        return None

    def _env(self, key: str) -> set:
        if key in _RANK_ENV:
            return {str(v) for v in self.rank(rank_kind(key))}
        if key in _WORLD_ENV:
            return {str(WORLD)}
        return self.atom(ast.Constant(value="env:" + key))

    def _call(self, node: ast.Call, depth: int) -> set:
        m = self.m
        func = node.func
        q = m.qual(func)
        fname = final_name(func)
        if q in ("os.environ.get", "os.getenv") and node.args and isinstance(node.args[0], ast.Constant):
            return self._env(str(node.args[0].value))
        if q and q.startswith("torch.distributed."):
            op = q.rsplit(".", 1)[1]
            if op in ("get_rank", "get_global_rank", "get_node_local_rank", "get_group_rank"):
                return self.rank(rank_kind(op))
            if op == "get_world_size":
                return {WORLD}
            if op in ("is_initialized", "is_available", "is_torchelastic_launched"):
                return {True}
        if fname in ("int", "str", "bool", "float") and isinstance(func, ast.Name) and len(node.args) == 1:
            vals = self.ev(node.args[0], depth + 1)
            conv = {"int": int, "str": str, "bool": bool, "float": float}[fname]
            try:
                return {conv(v) for v in vals}
            except Exception:  # noqa: BLE001
                raise _Unknown from None
        if fname in ("get_rank", "get_local_rank", "get_global_rank", "rank", "local_rank", "get_ordinal",
                     "get_process_index", "get_node_rank", "get_dist_rank", "get_local_ordinal") and \
                m.resolve_function(func, self.scope) is None:
            return self.rank(rank_kind(fname))
        if fname in ("get_world_size", "world_size", "size", "get_num_processes") and \
                m.resolve_function(func, self.scope) is None and fname != "size":
            return {WORLD}
        if fname and (is_main_name(fname) or fname in ("is_master_ordinal",)) and \
                m.resolve_function(func, self.scope) is None:
            return self.main(rank_kind(fname))
        owner, fn = m, m.resolve_function(func, self.scope)
        if fn is None and m.project is not None and m.import_from and depth < 8:
            # `rank, world = setup_dist()` / `if local_id() == 0:` with the helper in another project file
            got = m.project.resolve_call(m, func, self.scope)
            if got is not None and not isinstance(got[1], ast.ClassDef):
                owner, fn = got
        if fn is not None and depth < 8:
            rets = [s.value for s in owner.returns_of(fn) if s.value is not None]
            if rets and len(rets) <= 4:
                sub = self._sub(owner.scopes[fn])
                out: set = set()
                for r in rets:
                    out |= sub.ev(r, depth + 1)
                self._note(sub, rets[0])
                return out
        # an unknown function of the rank (`load_shard(rank)`, `open(f"ckpt{rank}")`): its result is data
        # that differs by rank (mentions_rank sees it), but not a rank *condition* to evaluate
        if self.collect and not self.hit:
            sub = _Eval(m, self.scope, self.r, self.sigma, collect=True)
            sub.visiting = self.visiting
            skip = {id(a) for a in non_data_args(node)} | _share_args(m, node, q)
            for a in (*node.args, *(k.value for k in node.keywords)):
                if id(a) in skip:
                    continue  # a device or a rank flag: not what the call returns
                try:
                    sub.ev(a, depth + 1)
                except Exception:  # noqa: BLE001
                    pass
            self.hit = self.hit or sub.hit
        return self.atom(node)


def _share_args(m: ModuleModel, call: ast.Call, q: str | None) -> set[int]:
    """The ``num_replicas`` / ``rank`` of a library's distributed sampler (torch's ``DistributedSampler``,
    torchdata's ``StatefulDistributedSampler``): they pick this rank's share of the indices, padded to the same
    length on every rank, so ``len(loader)`` and the step counts made from it are the same everywhere (torchtune's
    ``while inner_step_count < self._steps_per_epoch``).  A sampler class of the project is judged elsewhere."""
    if not (m.is_sampler_call(call) or ((q or "").endswith("DistributedSampler") and
                                        final_name(call.func) not in m.classes)):
        return set()
    return {id(a) for a in call.args[1:3]} | {id(k.value) for k in call.keywords if k.arg in ("num_replicas", "rank")}


def _cmp(op: ast.cmpop, a: Any, b: Any) -> bool:
    try:
        if isinstance(op, ast.Eq):
            return a == b
        if isinstance(op, ast.NotEq):
            return a != b
        if isinstance(op, ast.Lt):
            return a < b
        if isinstance(op, ast.LtE):
            return a <= b
        if isinstance(op, ast.Gt):
            return a > b
        if isinstance(op, ast.GtE):
            return a >= b
        if isinstance(op, ast.In):
            return a in b
        if isinstance(op, ast.NotIn):
            return a not in b
        if isinstance(op, ast.Is):
            return a is b
        if isinstance(op, ast.IsNot):
            return a is not b
    except Exception:  # noqa: BLE001
        raise _Unknown from None
    raise _Unknown


def _binop(op: ast.operator, a: Any, b: Any) -> Any:
    try:
        if isinstance(op, ast.Mod):
            if a == 0 and isinstance(a, int):
                return 0
            return a % b
        if isinstance(op, ast.Add):
            return a + b
        if isinstance(op, ast.Sub):
            return a - b
        if isinstance(op, ast.Mult):
            return a * b
        if isinstance(op, ast.FloorDiv):
            return a // b
        if isinstance(op, ast.BitAnd):
            return a & b
        if isinstance(op, ast.BitOr):
            return a | b
    except Exception:  # noqa: BLE001
        raise _Unknown from None
    raise _Unknown
