"""The semantic model of one module: imports, scopes, rank conditions, loops, DDP objects.

Pure stdlib ``ast``; never imports torch.  Rules ask this model questions
("is this call a collective?", "under which rank conditions does this statement
run?", "which DataLoader does this loop iterate?") instead of matching strings.

Rank conditions are decided by *evaluating* the condition for ranks 0..3 of a
world of 4, with every non-rank unknown (``args.distributed``, ``ngpus``) given
the same value on every rank (it is rank-independent by construction), trying a
few values for each.  A condition is rank-dependent when, for some such choice,
its truth differs between ranks.  So ``args.local_rank != -1`` (the classic
"are we distributed" test) is *not* a rank condition, ``rank % ngpus == 0`` is.
"""
from __future__ import annotations

import ast
import itertools
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator

WORLD = 4
RANKS = range(WORLD)

# ---------------------------------------------------------------- names ----
DDP_CLASSES = {
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
    "torch.nn.DistributedDataParallel",
}
DIST_SAMPLERS = {"torch.utils.data.DistributedSampler", "torch.utils.data.distributed.DistributedSampler"}
DATALOADERS = {"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"}
ITERABLE_DATASETS = {"torch.utils.data.IterableDataset", "torch.utils.data.dataset.IterableDataset"}
FABRIC_CLASSES = {"lightning.Fabric", "lightning.fabric.Fabric", "lightning_fabric.Fabric",
                  "lightning.fabric.fabric.Fabric", "pytorch_lightning.lite.LightningLite"}
ACCEL_CLASSES = {"accelerate.Accelerator", "accelerate.accelerator.Accelerator"}
BATCHNORMS = {f"torch.nn.{n}" for n in ("BatchNorm1d", "BatchNorm2d", "BatchNorm3d", "LazyBatchNorm1d",
                                         "LazyBatchNorm2d", "LazyBatchNorm3d")}
BATCHNORMS |= {n.replace("torch.nn.", "torch.nn.modules.batchnorm.") for n in BATCHNORMS}

TORCH_COLLECTIVES = {
    "all_reduce", "reduce", "broadcast", "barrier", "all_gather", "all_gather_object",
    "all_gather_into_tensor", "_all_gather_base", "gather", "gather_object", "scatter",
    "scatter_object_list", "reduce_scatter", "reduce_scatter_tensor", "_reduce_scatter_base",
    "all_to_all", "all_to_all_single", "broadcast_object_list", "monitored_barrier", "new_group",
    "all_reduce_coalesced", "all_gather_coalesced",
}
# torch.distributed.checkpoint: every rank takes part in saving / loading
DCP_COLLECTIVES = {f"torch.distributed.checkpoint.{n}" for n in ("save", "load", "save_state_dict",
                                                                  "load_state_dict", "async_save")}
# position of the `group` argument of torch.distributed's collectives
_GROUP_POS = {"barrier": 0, "monitored_barrier": 0, "all_reduce": 2, "broadcast": 2, "reduce": 3,
              "all_gather": 2, "all_gather_object": 2, "all_gather_into_tensor": 2, "gather": 3,
              "gather_object": 3, "scatter": 3, "scatter_object_list": 3, "reduce_scatter": 3,
              "reduce_scatter_tensor": 3, "all_to_all": 2, "all_to_all_single": 4,
              "broadcast_object_list": 2}
# collectives that write their result into their first argument
INPLACE_COLLECTIVES = {"all_reduce", "broadcast", "reduce", "all_reduce_coalesced"}
# collectives whose first argument is an output every rank receives in full (the same on every rank)
GATHER_OUTPUT_COLLECTIVES = {"all_gather", "all_gather_object", "all_gather_into_tensor", "_all_gather_base",
                             "broadcast_object_list", "all_gather_coalesced"}
FABRIC_COLLECTIVES = {"barrier", "all_reduce", "broadcast", "all_gather", "save"}
ACCEL_COLLECTIVES = {"wait_for_everyone", "gather", "gather_for_metrics", "reduce", "pad_across_processes"}
ACCEL_FUNCS = {"accelerate.utils." + n for n in ("gather", "broadcast", "reduce", "wait_for_everyone",
                                                  "pad_across_processes", "broadcast_object_list",
                                                  "gather_object")}
STRATEGY_COLLECTIVES = {"barrier", "broadcast", "reduce", "all_gather"}
# ddp_doctor.fixes helpers that run a collective inside (every rank must call them)
FIXES_COLLECTIVES = {"agree", "skip_if_nonfinite", "gather_variable", "rank_zero_first"}
AGREE_FUNCS = {"agree", "all_agree", "any_rank", "all_ranks", "sync_flag"}

_INT_RANK_RE = re.compile(
    r"(?i)^(?:(?:ddp|local|global|node|world|my|cur|current|proc|process|gpu|this|dist)_)?rank(?:_id|_idx|_index)?$"
    r"|^(?:local_)?process_index$|^(?:local_)?rank_?zero_?id$")
_MAIN_NAMES = {
    "is_master", "is_main", "is_main_process", "main_process", "master_process", "is_master_process",
    "is_chief", "is_global_zero", "is_local_zero", "is_rank_zero", "is_rank0", "is_rank_0",
    "is_local_main_process", "is_local_master", "local_master", "is_main_rank", "is_leader",
    "is_world_process_zero", "is_local_process_zero", "rank_zero", "is_zero_rank", "master_rank",
    "is_primary", "is_main_worker",
}
_WORLD_NAMES = {"world_size", "num_processes", "WORLD_SIZE", "ddp_world_size", "nprocs", "num_replicas"}
_RANK_ENV = {"RANK", "LOCAL_RANK", "GROUP_RANK", "NODE_RANK", "SLURM_PROCID", "SLURM_LOCALID",
             "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK"}
_WORLD_ENV = {"WORLD_SIZE", "LOCAL_WORLD_SIZE", "SLURM_NTASKS"}
RANK_DECORATORS = {"rank_zero_only", "main_process_only", "on_main_process", "on_local_main_process",
                   "master_only", "rank0_only", "on_rank_zero"}


def is_rank_name(name: str) -> bool:
    return bool(_INT_RANK_RE.match(name))


def is_main_name(name: str) -> bool:
    return name in _MAIN_NAMES


def final_name(node: ast.AST) -> str | None:
    """``a.b.c`` -> ``c``; ``f`` -> ``f``; calls and subscripts -> None."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def dotted(node: ast.AST) -> str | None:
    """Source-like dotted text of a Name/Attribute chain (``self.model``), else None."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
        return ".".join(reversed(parts))
    return None


def kwarg(call: ast.Call, name: str) -> ast.keyword | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw
    return None


def arg_or_kw(call: ast.Call, pos: int, name: str) -> ast.expr | None:
    kw = kwarg(call, name)
    if kw is not None:
        return kw.value
    if len(call.args) > pos and not any(isinstance(a, ast.Starred) for a in call.args[: pos + 1]):
        return call.args[pos]
    return None


def has_star_kwargs(call: ast.Call) -> bool:
    return any(kw.arg is None for kw in call.keywords)


def const_value(node: ast.AST | None) -> Any:
    """The literal value of a Constant (or -N); a sentinel otherwise."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        try:
            return -node.operand.value
        except TypeError:
            return NOTCONST
    return NOTCONST


NOTCONST = object()

# arguments that say *where* a value lives, not *what* it is: the rank in them does not make the
# result differ between ranks (``torch.zeros(3, device=f"cuda:{rank}")``, ``x.to(local_rank)``)
_DEVICE_KWARGS = {"device", "device_ids", "output_device", "map_location", "non_blocking", "device_id"}
_DEVICE_CALLS = {"to", "cuda", "device", "set_device", "pin_memory"}


def is_predicate(node: ast.AST) -> bool:
    """A boolean test: ``rank == 0``, ``local_rank not in [-1, 0]``, ``not is_main``, ``fabric.is_global_zero``."""
    if isinstance(node, (ast.Compare, ast.BoolOp)) or isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return True
    if isinstance(node, ast.Call):
        node = node.func
    name = final_name(node)
    return bool(name) and is_main_name(name)


def non_data_args(call: ast.Call) -> list[ast.expr]:
    """Arguments of ``call`` that do not make its result differ between ranks even when they hold the
    rank: device placement (``device=``, ``.to(rank)``, ``torch.device("cuda", rank)``) and rank
    predicates passed as keyword flags (``tqdm(loader, disable=rank != 0)``,
    ``MNIST(root, download=is_main)``, ``verbose=rank == 0``).  A per-rank *value*
    (``batch_size=sizes[rank]``, ``shards[rank]``, ``loader_for(rank)``) is data and not listed."""
    if final_name(call.func) in _DEVICE_CALLS and isinstance(call.func, ast.Attribute):
        return [*call.args, *(k.value for k in call.keywords)]
    return [k.value for k in call.keywords
            if k.arg is not None and (k.arg in _DEVICE_KWARGS or is_predicate(k.value))]


def data_names(node: ast.AST) -> set[str]:
    """The names ``node`` reads, leaving out those only in :func:`non_data_args` positions."""
    out: set[str] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if isinstance(n, ast.Name):
            out.add(n.id)
            continue
        skip = {id(a) for a in non_data_args(n)} if isinstance(n, ast.Call) else ()
        for ch in ast.iter_child_nodes(n):
            if isinstance(ch, ast.keyword):
                if id(ch.value) not in skip:
                    stack.append(ch.value)
            elif id(ch) not in skip:
                stack.append(ch)
    return out

# ------------------------------------------------------------- scopes ----
FuncNode = (ast.FunctionDef, ast.AsyncFunctionDef)
LoopNode = (ast.For, ast.AsyncFor, ast.While)


@dataclass(eq=False)
class Cond:
    """An enclosing condition: ``test`` holds (``positive``) or does not hold."""

    test: ast.expr
    positive: bool
    loop_level: int  # number of loops enclosing the ``if`` (to tell conditions inside a loop)
    node: ast.stmt  # the If/While statement (or the early-exit If)


@dataclass(eq=False)
class Site:
    """A call, with the conditions and loops under which it runs in its scope."""

    call: ast.Call
    conds: tuple[Cond, ...]
    loops: tuple[ast.stmt, ...]
    stmt: ast.stmt
    scope: "Scope"


@dataclass(eq=False)
class Jump:
    stmt: ast.stmt  # Continue / Break / Return / Raise / sys.exit Expr
    kind: str
    conds: tuple[Cond, ...]
    loops: tuple[ast.stmt, ...]
    scope: "Scope"


@dataclass(eq=False)
class Scope:
    node: ast.AST
    name: str
    module: "ModuleModel"
    cls: ast.ClassDef | None = None
    params: list[str] = field(default_factory=list)
    assigns: dict[str, list[tuple[ast.expr, tuple[Cond, ...]]]] = field(default_factory=dict)
    sites: list[Site] = field(default_factory=list)
    jumps: list[Jump] = field(default_factory=list)
    loops: list[tuple[ast.stmt, tuple[Cond, ...], tuple[ast.stmt, ...]]] = field(default_factory=list)
    stmts: list[tuple[ast.stmt, tuple[Cond, ...], tuple[ast.stmt, ...]]] = field(default_factory=list)
    rank_guarded_all: bool = False  # decorated @rank_zero_only etc.

    @property
    def is_module(self) -> bool:
        return isinstance(self.node, ast.Module)

    def lookup(self, name: str) -> list[ast.expr]:
        vals = self.assigns.get(name)
        if vals is not None:
            return [v for v, _ in vals]
        if not self.is_module and name not in self.params:
            return [v for v, _ in self.module.scope.assigns.get(name, [])]
        return []


def _terminates(body: list[ast.stmt]) -> str | None:
    """The kind of unconditional exit that ends ``body`` (return/raise/continue/break/exit)."""
    if not body:
        return None
    last = body[-1]
    if isinstance(last, ast.Return):
        return "return"
    if isinstance(last, ast.Raise):
        return "raise"
    if isinstance(last, ast.Continue):
        return "continue"
    if isinstance(last, ast.Break):
        return "break"
    if isinstance(last, ast.Expr) and isinstance(last.value, ast.Call):
        fn = dotted(last.value.func)
        if fn in ("sys.exit", "exit", "quit", "os._exit"):
            args = last.value.args
            if args and not (isinstance(args[0], ast.Constant) and args[0].value in (0, None)):
                # a failing exit is a crash like an uncaught exception: torchrun's agent sees the
                # non-zero status and tears the other ranks down, so it cannot leave them waiting
                return "raise"
            return "exit"
    return None


def iter_header_exprs(stmt: ast.stmt) -> Iterator[ast.AST]:
    """Expressions evaluated by ``stmt`` itself (not by the statements nested in it)."""
    if isinstance(stmt, (ast.If, ast.While)):
        yield stmt.test
    elif isinstance(stmt, (ast.For, ast.AsyncFor)):
        yield stmt.iter
    elif isinstance(stmt, (ast.With, ast.AsyncWith)):
        for item in stmt.items:
            yield item.context_expr
    elif isinstance(stmt, FuncNode):
        yield from stmt.decorator_list
        yield from stmt.args.defaults
        yield from (d for d in stmt.args.kw_defaults if d is not None)
    elif isinstance(stmt, ast.ClassDef):
        yield from stmt.decorator_list
        yield from stmt.bases
    elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
        for h in stmt.handlers:
            if h.type is not None:
                yield h.type
    elif isinstance(stmt, ast.Match):
        yield stmt.subject
    else:
        yield stmt


_SKIP_EXPR = (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
# node types that hold no call: never pushed (operators, contexts, names, constants)
_NO_CALL_TYPES = frozenset(
    [ast.Name, ast.Constant, ast.Load, ast.Store, ast.Del, ast.Pass, ast.Break, ast.Continue, ast.alias,
     ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Import, ast.ImportFrom,
     ast.Global, ast.Nonlocal]
    + [c for base in (ast.operator, ast.cmpop, ast.unaryop, ast.boolop) for c in base.__subclasses__()])


def calls_in(node: ast.AST) -> list[ast.Call]:
    """Calls inside an expression (or a simple statement), not entering lambdas."""
    out = []
    stack = [node]
    pop, push = stack.pop, stack.append
    Call, Attribute, AST = ast.Call, ast.Attribute, ast.AST
    skip = _NO_CALL_TYPES
    while stack:
        n = pop()
        t = type(n)
        if t is Attribute:
            push(n.value)
            continue
        if t is Call:
            out.append(n)
        for name in n._fields:
            v = getattr(n, name, None)
            if type(v) is list:
                for x in v:
                    if type(x) not in skip and isinstance(x, AST):
                        push(x)
            elif type(v) not in skip and isinstance(v, AST):
                push(v)
    out.reverse()
    return out


class _Unknown(Exception):
    pass


# Values tried for rank-independent unknowns (the same on every rank).
_DOMAIN = (None, 0, 1, 2)
_MAX_ATOMS = 3


class ModuleModel:
    """Everything the rules need to know about one parsed module."""

    def __init__(self, tree: ast.Module, path: str = "<string>", source: str = ""):
        self.tree = tree
        self.path = path
        self.source = source
        self.imports: dict[str, str] = {}
        self.scopes: dict[ast.AST, Scope] = {}
        self.functions: dict[str, list[ast.AST]] = {}  # module-level and nested defs by name
        self.methods: dict[ast.ClassDef, dict[str, ast.AST]] = {}
        self.self_assigns: dict[ast.ClassDef, dict[str, list[ast.expr]]] = {}
        self.value_scope: dict[int, "Scope"] = {}  # id(value of a self.attr assignment) -> its scope
        self.classes: dict[str, ast.ClassDef] = {}
        self.has_main_guard = False
        self._cache: dict[Any, Any] = {}
        self._collect()
        self.scope = self.scopes[tree]

    # ---------------------------------------------------------- collection
    def _collect(self) -> None:
        # statement-level walk only (expressions are visited once, by _walk): imports, defs, classes
        self.def_parent: dict[ast.AST, ast.AST] = {}
        self.spans: list[tuple[int, int, ast.AST]] = []  # (first line, last line, def) for function names
        func_nodes: list[tuple[ast.AST, ast.ClassDef | None]] = []
        stack: list[tuple[list[ast.stmt], ast.AST]] = [(self.tree.body, self.tree)]
        while stack:
            body, parent = stack.pop()
            for node in body:
                t = type(node)
                if t is ast.Import:
                    for a in node.names:
                        if a.asname:
                            self.imports[a.asname] = a.name
                        else:
                            top = a.name.split(".")[0]
                            self.imports[top] = top
                    continue
                if t is ast.ImportFrom:
                    if node.module and not node.level:
                        for a in node.names:
                            if a.name != "*":
                                self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
                    continue
                if t is ast.FunctionDef or t is ast.AsyncFunctionDef:
                    self.functions.setdefault(node.name, []).append(node)
                    self.def_parent[node] = parent
                    self.spans.append((node.lineno, node.end_lineno or node.lineno, node))
                    func_nodes.append((node, parent if isinstance(parent, ast.ClassDef) else None))
                    stack.append((node.body, node))
                    continue
                if t is ast.ClassDef:
                    self.classes[node.name] = node
                    self.methods[node] = {x.name: x for x in node.body if isinstance(x, FuncNode)}
                    stack.append((node.body, node))
                    continue
                if t is ast.If:
                    if self._is_main_guard(node.test):
                        self.has_main_guard = True
                    stack.append((node.body, parent))
                    stack.append((node.orelse, parent))
                elif t in (ast.For, ast.AsyncFor, ast.While):
                    stack.append((node.body, parent))
                    stack.append((node.orelse, parent))
                elif t in (ast.With, ast.AsyncWith):
                    stack.append((node.body, parent))
                elif t is ast.Try or t.__name__ == "TryStar":
                    stack.append((node.body, parent))
                    stack.append((node.orelse, parent))
                    stack.append((node.finalbody, parent))
                    for h in node.handlers:
                        stack.append((h.body, parent))
                elif t is ast.Match:
                    for case in node.cases:
                        stack.append((case.body, parent))
        self._build_scope(self.tree, "<module>", None)
        for node, cls in func_nodes:
            self._build_scope(node, node.name, cls)
        # module-level aliases: DDP = torch.nn.parallel.DistributedDataParallel
        for name, vals in self.scopes[self.tree].assigns.items():
            if len(vals) == 1 and name not in self.imports:
                q = self.qual(vals[0][0])
                if q and "." in q:
                    self.imports[name] = q
        self.spans.sort(key=lambda x: (x[0], -x[1]))

    @staticmethod
    def _is_main_guard(test: ast.expr) -> bool:
        return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
                and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators))

    def _build_scope(self, node: ast.AST, name: str, cls: ast.ClassDef | None) -> None:
        scope = Scope(node, name, self, cls)
        if isinstance(node, FuncNode):
            a = node.args
            scope.params = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
            if a.vararg:
                scope.params.append(a.vararg.arg)
            if a.kwarg:
                scope.params.append(a.kwarg.arg)
            for d in node.decorator_list:
                dn = final_name(d.func if isinstance(d, ast.Call) else d)
                if dn in RANK_DECORATORS:
                    scope.rank_guarded_all = True
        self.scopes[node] = scope
        body = node.body
        self._walk(scope, body, (), ())

    def _walk(self, scope: Scope, body: list[ast.stmt], conds: tuple[Cond, ...], loops: tuple[ast.stmt, ...]) -> None:
        for stmt in body:
            scope.stmts.append((stmt, conds, loops))
            for expr in iter_header_exprs(stmt):
                for call in calls_in(expr):
                    scope.sites.append(Site(call, conds, loops, stmt, scope))
            self._record_assign(scope, stmt, conds)
            if isinstance(stmt, FuncNode) or isinstance(stmt, ast.ClassDef):
                if isinstance(stmt, ast.ClassDef):
                    for sub in stmt.body:
                        if not isinstance(sub, FuncNode):
                            self._walk(scope, [sub], conds, loops)
                continue
            if isinstance(stmt, (ast.Continue, ast.Break, ast.Return, ast.Raise)):
                scope.jumps.append(Jump(stmt, type(stmt).__name__.lower(), conds, loops, scope))
            elif isinstance(stmt, ast.Expr) and _terminates([stmt]) in ("exit", "raise"):
                scope.jumps.append(Jump(stmt, _terminates([stmt]), conds, loops, scope))
            if isinstance(stmt, ast.If):
                lvl = len(loops)
                self._walk(scope, stmt.body, conds + (Cond(stmt.test, True, lvl, stmt),), loops)
                self._walk(scope, stmt.orelse, conds + (Cond(stmt.test, False, lvl, stmt),), loops)
                # early exit: `if C: return` -> the rest of this block runs only when not C.  A raise is
                # not one: the failing rank's exit makes the launcher stop the others (no silent wait).
                if not stmt.orelse and _terminates(stmt.body) not in (None, "raise"):
                    conds = conds + (Cond(stmt.test, False, lvl, stmt),)
                elif stmt.orelse and not _terminates(stmt.body) and _terminates(stmt.orelse) not in (None, "raise"):
                    conds = conds + (Cond(stmt.test, True, lvl, stmt),)
            elif isinstance(stmt, LoopNode):
                scope.loops.append((stmt, conds, loops))
                inner = loops + (stmt,)
                if isinstance(stmt, ast.While):
                    self._walk(scope, stmt.body, conds + (Cond(stmt.test, True, len(loops), stmt),), inner)
                else:
                    self._walk(scope, stmt.body, conds, inner)
                self._walk(scope, stmt.orelse, conds, loops)
            elif isinstance(stmt, (ast.With, ast.AsyncWith)):
                self._walk(scope, stmt.body, conds, loops)
            elif isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar":
                self._walk(scope, stmt.body, conds, loops)
                for h in stmt.handlers:
                    self._walk(scope, h.body, conds, loops)
                self._walk(scope, stmt.orelse, conds, loops)
                self._walk(scope, stmt.finalbody, conds, loops)
            elif isinstance(stmt, ast.Match):
                for case in stmt.cases:
                    self._walk(scope, case.body, conds, loops)

    def _record_assign(self, scope: Scope, stmt: ast.stmt, conds: tuple[Cond, ...]) -> None:
        targets: list[ast.expr] = []
        value: ast.expr | None = None
        if isinstance(stmt, ast.Assign):
            targets, value = stmt.targets, stmt.value
        elif isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and stmt.value is not None:
            targets, value = [stmt.target], stmt.value
            if isinstance(stmt, ast.AugAssign):
                value = ast.BinOp(left=stmt.target, op=stmt.op, right=stmt.value)
        elif isinstance(stmt, (ast.For, ast.AsyncFor)):
            targets, value = [stmt.target], ast.Subscript(value=stmt.iter, slice=ast.Constant(value=0))
        elif isinstance(stmt, (ast.With, ast.AsyncWith)):
            for item in stmt.items:
                if item.optional_vars is not None:
                    self._bind(scope, item.optional_vars, item.context_expr, conds)
            return
        for t in targets:
            self._bind(scope, t, value, conds)

    def _bind(self, scope: Scope, target: ast.expr, value: ast.expr, conds: tuple[Cond, ...]) -> None:
        if isinstance(target, ast.Name):
            scope.assigns.setdefault(target.id, []).append((value, conds))
        elif isinstance(target, (ast.Tuple, ast.List)):
            for i, elt in enumerate(target.elts):
                if isinstance(value, (ast.Tuple, ast.List)) and len(value.elts) == len(target.elts):
                    self._bind(scope, elt, value.elts[i], conds)
                else:
                    sub = ast.Subscript(value=value, slice=ast.Constant(value=i))
                    ast.copy_location(sub, value)
                    self._bind(scope, elt, sub, conds)
        elif isinstance(target, ast.Attribute):
            d = dotted(target)
            if d and d.startswith("self.") and scope.cls is not None:
                self.self_assigns.setdefault(scope.cls, {}).setdefault(d, []).append(value)
                self.value_scope[id(value)] = scope
            if d:
                scope.assigns.setdefault(d, []).append((value, conds))

    # --------------------------------------------------------- resolution
    def qual(self, node: ast.AST) -> str | None:
        """Fully qualified name of an imported object reference (``dist.barrier`` -> ``torch.distributed.barrier``)."""
        if isinstance(node, ast.Name):
            return self.imports.get(node.id)
        if isinstance(node, ast.Attribute):
            base = self.qual(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    def function_at(self, line: int) -> ast.AST | None:
        """The innermost def whose span holds ``line``."""
        best = None
        for start, end, node in self.spans:
            if start > line:
                break
            if line <= end:
                best = node
        return best

    def returns_of(self, fn: ast.AST) -> list[ast.Return]:
        scope = self.scopes.get(fn)
        return [j.stmt for j in scope.jumps if j.kind == "return"] if scope is not None else []

    def values_of(self, expr: ast.expr, scope: Scope) -> list[ast.expr]:
        """Expressions assigned to a Name / self.attr (in scope, then module / class)."""
        d = dotted(expr)
        if d is None:
            return []
        vals = scope.lookup(d)
        if not vals and d.startswith("self.") and scope.cls is not None:
            vals = self.self_assigns.get(scope.cls, {}).get(d, [])
        return vals

    def scope_of_value(self, value: ast.expr, default: Scope) -> Scope:
        """The scope a value returned by :meth:`values_of` must be resolved in (self.attr values live in
        the method that assigned them)."""
        return self.value_scope.get(id(value), default)

    def resolve_function(self, func: ast.expr, scope: Scope) -> ast.AST | None:
        """The same-file def a call targets: ``helper(...)``, ``self.method(...)``, ``Class.method``."""
        if isinstance(func, ast.Name):
            if func.id in self.imports or func.id in scope.params:
                return None
            defs = self.functions.get(func.id)
            if defs:
                # prefer a def in the same scope chain
                for d in defs:
                    p = self.def_parent.get(d)
                    if p is scope.node or p is self.tree:
                        return d
                return defs[0] if len(defs) == 1 else None
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            if func.value.id == "self" and scope.cls is not None:
                return self.methods.get(scope.cls, {}).get(func.attr)
            cls = self.classes.get(func.value.id)
            if cls is not None:
                return self.methods.get(cls, {}).get(func.attr)
        return None

    def call_sites_of(self, fn: ast.AST) -> list[Site]:
        key = ("callers", fn)
        if key in self._cache:
            return self._cache[key]
        out = []
        parent = self.def_parent.get(fn)
        ctor_of = parent.name if isinstance(parent, ast.ClassDef) and getattr(fn, "name", "") == "__init__" else None
        fname = getattr(fn, "name", None)
        cands = self._sites_named(fname) if fname else []
        if ctor_of is not None and ctor_of != fname:
            seq = self._cache["site_seq"]  # keep the module's walk order, as before the index
            cands = sorted(cands + self._sites_named(ctor_of), key=lambda st: seq[id(st)])
        for site in cands:
            name = final_name(site.call.func)
            if name == fname:
                if self.resolve_function(site.call.func, site.scope) is fn:
                    out.append(site)
            elif ctor_of is not None and name == ctor_of and isinstance(site.call.func, ast.Name) and \
                    self.classes.get(ctor_of) is parent:
                out.append(site)  # Trainer(model, loader): a call of Trainer.__init__
        self._cache[key] = out
        return out

    def function_referenced_as_value(self, fn: ast.AST) -> bool:
        """``mp.spawn(main_worker, ...)``, ``fabric.launch(train)``: the function is run, not called here."""
        name = getattr(fn, "name", None)
        for scope in self.scopes.values():
            for site in scope.sites:
                node = site.call
                for a in (*node.args, *(k.value for k in node.keywords)):
                    if isinstance(a, ast.Name) and a.id == name:
                        return True
        return False

    # ------------------------------------------------------------ kinds
    def is_ddp_call(self, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        q = self.qual(call.func)
        if q in DDP_CLASSES:
            return True
        return q is None and final_name(call.func) in ("DistributedDataParallel",)

    def is_sampler_call(self, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        q = self.qual(call.func)
        if q in DIST_SAMPLERS or (q is None and final_name(call.func) == "DistributedSampler"):
            return True
        return isinstance(call.func, ast.Name) and q is None and call.func.id in self._sampler_aliases()

    def _is_sampler_class(self, node: ast.AST) -> bool:
        q = self.qual(node)
        return q in DIST_SAMPLERS or (q is None and final_name(node) == "DistributedSampler")

    def _sampler_aliases(self) -> set[str]:
        """Names bound to the DistributedSampler class itself, possibly in one branch:
        ``train_sampler = RandomSampler if args.local_rank == -1 else DistributedSampler``."""
        got = self._cache.get("sampler_aliases")
        if got is None:
            got = set()
            for scope in self.scopes.values():
                for name, vals in scope.assigns.items():
                    if "." in name:
                        continue
                    for v, _c in vals:
                        branches = [v.body, v.orelse] if isinstance(v, ast.IfExp) else \
                            v.values if isinstance(v, ast.BoolOp) else [v]
                        if any(self._is_sampler_class(b) for b in branches):
                            got.add(name)
            self._cache["sampler_aliases"] = got
        return got

    def is_dataloader_call(self, call: ast.AST) -> bool:
        if not isinstance(call, ast.Call):
            return False
        q = self.qual(call.func)
        return q in DATALOADERS or (q is None and final_name(call.func) == "DataLoader" and
                                    "DataLoader" not in self.classes)

    def _receiver_kind(self, recv: ast.expr, scope: Scope) -> str | None:
        """'fabric' / 'accelerator' / 'strategy' for the objects whose methods are collectives."""
        key = ("recv", id(recv))
        d = dotted(recv)
        if d is None:
            return None
        last = d.split(".")[-1]
        # by name only when the library is imported here (Lightning's own `self.accelerator` is not
        # Hugging Face accelerate's Accelerator)
        if last in ("fabric", "_fabric", "lite") and self._imports_any("lightning", "lightning_fabric",
                                                                        "pytorch_lightning"):
            return "fabric"
        if last in ("accelerator", "_accelerator") and self._imports_any("accelerate"):
            return "accelerator"
        if last == "strategy" and self._imports_any("lightning", "pytorch_lightning"):
            return "strategy"
        for v in self.values_of(recv, scope):
            if isinstance(v, ast.Call):
                q = self.qual(v.func)
                if q in FABRIC_CLASSES:
                    return "fabric"
                if q in ACCEL_CLASSES:
                    return "accelerator"
        del key
        return None

    def _imports_any(self, *roots: str) -> bool:
        key = ("imports_any", roots)
        if key not in self._cache:
            self._cache[key] = any(q.split(".")[0] in roots for q in self.imports.values())
        return self._cache[key]

    def collective_name(self, call: ast.Call, scope: Scope) -> str | None:
        """``dist.barrier`` etc. when ``call`` is a collective every rank of the group must enter."""
        func = call.func
        q = self.qual(func)
        if q:
            if q in DDP_CLASSES:
                return "DistributedDataParallel"  # construction verifies and broadcasts parameters
            if q.startswith("torch.distributed."):
                if q in DCP_COLLECTIVES:
                    return "dcp." + q.rsplit(".", 1)[1]
                op = q.rsplit(".", 1)[1]
                if op in TORCH_COLLECTIVES and q.count(".") <= 3 and not q.startswith("torch.distributed.checkpoint"):
                    return f"dist.{op}"
                return None
            if q in ACCEL_FUNCS:
                return "accelerate." + q.rsplit(".", 1)[1]
            if q.startswith("ddp_doctor.fixes.") and q.rsplit(".", 1)[1] in FIXES_COLLECTIVES:
                return "fixes." + q.rsplit(".", 1)[1]
            return None
        if isinstance(func, ast.Attribute):
            kind = self._receiver_kind(func.value, scope)
            if kind == "fabric" and func.attr in FABRIC_COLLECTIVES:
                return f"fabric.{func.attr}"
            if kind == "accelerator" and func.attr in ACCEL_COLLECTIVES:
                return f"accelerator.{func.attr}"
            if kind == "strategy" and func.attr in STRATEGY_COLLECTIVES:
                return f"strategy.{func.attr}"
            if isinstance(func.value, ast.Name) and func.value.id == "self" and self._is_lightning_module(scope.cls):
                if func.attr == "all_gather":
                    return "self.all_gather"
                if func.attr in ("log", "log_dict"):
                    kw = kwarg(call, "sync_dist")
                    if kw is not None and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                        return f"self.{func.attr}(sync_dist=True)"
        return None

    def _is_lightning_module(self, cls: ast.ClassDef | None) -> bool:
        if cls is None:
            return False
        for b in cls.bases:
            name = final_name(b) or ""
            if name in ("LightningModule", "LightningLite") or (self.qual(b) or "").endswith("LightningModule"):
                return True
        return False

    def uses_subgroup(self, call: ast.Call) -> bool:
        """A collective on an explicit process group: legitimately entered by that group's ranks only."""
        q = self.qual(call.func) or ""
        pos = _GROUP_POS.get(q.rsplit(".", 1)[-1]) if q.startswith("torch.distributed.") else None
        g = arg_or_kw(call, pos, "group") if pos is not None else (kwarg(call, "group").value
                                                                    if kwarg(call, "group") else None)
        if g is None:
            return False
        if isinstance(g, ast.Constant) and g.value is None:
            return False
        d = dotted(g) or ""
        return not d.endswith("WORLD")

    def is_backward_call(self, call: ast.Call) -> bool:
        return isinstance(call.func, ast.Attribute) and call.func.attr in ("backward", "manual_backward")

    # ---------------------------------------------------- distributed-ness
    @property
    def is_distributed(self) -> bool:
        """The module uses torch.distributed, DDP, Fabric, accelerate or Lightning."""
        if "distributed" in self._cache:
            return self._cache["distributed"]
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
        self._cache["distributed"] = res
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

    # ------------------------------------------------------- DDP models
    def is_ddp_value(self, expr: ast.expr, scope: Scope, depth: int = 0) -> bool:
        """Does ``expr`` hold a DDP-wrapped model (``model = DDP(net)``, ``model, opt = fabric.setup(...)``)?"""
        if depth > 4:
            return False
        if isinstance(expr, ast.Call):
            if self.is_ddp_call(expr):
                return True
            f = expr.func
            if isinstance(f, ast.Attribute) and f.attr in ("setup", "setup_module") and \
                    self._receiver_kind(f.value, scope) == "fabric":
                return True
            return False
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Constant):
            inner = expr.value
            if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute):
                f = inner.func
                kind = self._receiver_kind(f.value, scope)
                if kind == "fabric" and f.attr == "setup" and expr.slice.value == 0:
                    return True
                if kind == "accelerator" and f.attr == "prepare":
                    i = expr.slice.value
                    if isinstance(i, int) and i < len(inner.args):
                        a = inner.args[i]
                        n = (dotted(a) or "").split(".")[-1].lower()
                        return ("model" in n or n in ("net", "network", "module", "ddp")) and \
                            not any(k in n for k in ("optim", "sched", "loader"))
            return False
        if isinstance(expr, (ast.Name, ast.Attribute)):
            if isinstance(expr, ast.Attribute) and expr.attr == "module":
                return False
            return any(self.is_ddp_value(v, scope, depth + 1) for v in self.values_of(expr, scope)
                       if v is not expr)
        return False

    # --------------------------------------------------- rank conditions
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
        (so `step % 4 == 3` can be true)."""
        atoms = atoms[:_MAX_ATOMS]
        domain = list(_DOMAIN)
        for e in exprs:
            for n in ast.walk(e):
                if isinstance(n, ast.Constant) and type(n.value) is int and n.value not in domain and \
                        len(domain) < 8:
                    domain.append(n.value)
        for combo in itertools.product(domain, repeat=len(atoms)):
            yield dict(zip(atoms, combo))

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
            if got and any(self._mentions_rank_shallow(arg, sc) for arg, sc in got):
                res = got
        self._cache[key] = res
        return res

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

    def _sites_named(self, name: str) -> list[Site]:
        """Call sites whose callee's final name is ``name`` (an index built once per module)."""
        index = self._cache.get("sites_by_name")
        if index is None:
            index = {}
            seq: dict[int, int] = {}
            for scope in self.scopes.values():
                for site in scope.sites:
                    seq[id(site)] = len(seq)
                    n = final_name(site.call.func)
                    if n is not None:
                        index.setdefault(n, []).append(site)
            self._cache["sites_by_name"] = index
            self._cache["site_seq"] = seq
        return index.get(name, [])

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

    def atom(self, node: ast.AST) -> set:
        key = self.m.atom_key(node)
        if self.collect:
            if key not in self.atoms:
                self.atoms.append(key)
            return {0}
        if key in self.sigma:
            return {self.sigma[key]}
        raise _Unknown

    def rank(self) -> set:
        self.hit = True
        return {self.r}

    def main(self) -> set:
        self.hit = True
        return {self.r == 0}

    def ev(self, node: ast.AST, depth: int) -> set:
        if depth > 12:
            raise _Unknown
        m = self.m
        if isinstance(node, ast.Constant):
            return {node.value}
        if isinstance(node, ast.Name):
            n = node.id
            if is_rank_name(n):
                return self.rank()
            if is_main_name(n):
                return self.main()
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
                return self.rank()
            if is_main_name(a):
                return self.main()
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
        if isinstance(node, ast.BoolOp):
            if self.collect:
                for v in node.values:
                    try:
                        self.ev(v, depth + 1)
                    except Exception:  # noqa: BLE001
                        pass
                return {0}
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
                    self.hit = self.hit or sub.hit
        finally:
            self.visiting.discard(key)
        if len(out) > 16:
            raise _Unknown
        return out

    def _sub(self, scope: "Scope", collect: bool | None = None) -> "_Eval":
        sub = _Eval(self.m, scope, self.r, self.sigma, self.collect if collect is None else collect)
        if collect is None:
            sub.atoms = self.atoms
        sub.visiting = self.visiting
        sub.no_params = self.no_params
        return sub

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
            self.hit = True
            return {str(self.r)}
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
                return self.rank()
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
            return self.rank()
        if fname in ("get_world_size", "world_size", "size", "get_num_processes") and \
                m.resolve_function(func, self.scope) is None and fname != "size":
            return {WORLD}
        if fname and (is_main_name(fname) or fname in ("is_master_ordinal",)) and \
                m.resolve_function(func, self.scope) is None:
            return self.main()
        fn = m.resolve_function(func, self.scope)
        if fn is not None and depth < 8:
            inner = m.scopes[fn]
            rets = [s.value for s in m.returns_of(fn) if s.value is not None]
            if rets and len(rets) <= 4:
                sub = self._sub(inner)
                out: set = set()
                for r in rets:
                    out |= sub.ev(r, depth + 1)
                self.hit = self.hit or sub.hit
                return out
        # an unknown function of the rank (`load_shard(rank)`, `open(f"ckpt{rank}")`): its result is data
        # that differs by rank (mentions_rank sees it), but not a rank *condition* to evaluate
        if self.collect and not self.hit:
            sub = _Eval(m, self.scope, self.r, self.sigma, collect=True)
            sub.visiting = self.visiting
            skip = {id(a) for a in non_data_args(node)}
            for a in (*node.args, *(k.value for k in node.keywords)):
                if id(a) in skip:
                    continue  # a device or a rank flag: not what the call returns
                try:
                    sub.ev(a, depth + 1)
                except Exception:  # noqa: BLE001
                    pass
            self.hit = self.hit or sub.hit
        return self.atom(node)


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
