"""Scopes and names: the per-scope records (conditions, call sites, jumps, assignments) and the
index of one module's imports, defs, classes and call sites, with name resolution over it."""
from __future__ import annotations

import ast
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ddp_doctor.lint.names import RANK_DECORATORS, final_name

if TYPE_CHECKING:
    from ddp_doctor.lint.model import ModuleModel

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
class GuardedCall:
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
    sites: list[GuardedCall] = field(default_factory=list)
    jumps: list[Jump] = field(default_factory=list)
    loops: list[tuple[ast.stmt, tuple[Cond, ...], tuple[ast.stmt, ...]]] = field(default_factory=list)
    stmts: list[tuple[ast.stmt, tuple[Cond, ...], tuple[ast.stmt, ...]]] = field(default_factory=list)
    decorators: list[ast.expr] = field(default_factory=list)
    _rank_guarded: bool | None = None
    # the project decorator that makes it so: (its name, the wrapper's guarded call as a Related)
    guard_hop: tuple | None = None

    @property
    def rank_guarded_all(self) -> bool:
        """Every call runs only on some ranks: decorated ``@rank_zero_only`` or a project decorator whose
        wrapper calls the function only under a rank condition (asked lazily: the answer may need the
        decorator's file, known only once the project is)."""
        if self._rank_guarded is None:
            self._rank_guarded = False  # a decorator that decorates itself ends here
            for d in self.decorators:
                got = self.module.is_rank_decorator(d)
                if got:
                    self._rank_guarded = True
                    if got is not True:
                        self.guard_hop = (final_name(d.func if isinstance(d, ast.Call) else d), got)
                    break
        return self._rank_guarded

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


class ScopeIndex:
    """Mixin of :class:`~ddp_doctor.lint.model.ModuleModel`: collection of imports, defs and scopes,
    and resolution of names and calls to the defs of this module."""

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
                    self.import_modules.extend((0, a.name) for a in node.names)
                    for a in node.names:
                        if a.asname:
                            self.imports[a.asname] = a.name
                            self.import_from[a.asname] = (0, a.name, None)
                        else:
                            top = a.name.split(".")[0]
                            self.imports[top] = top
                            self.import_from[top] = (0, top, None)
                    continue
                if t is ast.ImportFrom:
                    base = node.module or ""
                    self.import_modules.append((node.level, base))
                    self.import_modules.extend((node.level, f"{base}.{a.name}" if base else a.name)
                                               for a in node.names if a.name != "*")
                    for a in node.names:
                        if a.name == "*":
                            continue
                        if node.module and not node.level:
                            self.imports[a.asname or a.name] = f"{node.module}.{a.name}"
                        # relative ones too: the project resolves them to files (`from .engine import f`)
                        self.import_from[a.asname or a.name] = (node.level, node.module or "", a.name)
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
            scope.decorators = list(node.decorator_list)
        self.scopes[node] = scope
        body = node.body
        self._walk(scope, body, (), ())

    def is_rank_decorator(self, dec: ast.expr):
        """``dec`` runs the function it decorates on some ranks only: a known name (``rank_zero_only``,
        ``main_process_only``, ...), or a decorator of this file or another project file whose wrapper
        calls the decorated function only under a rank condition (``if get_rank() == 0: return fn(...)``).
        True for a known name; for a project decorator, the wrapper's guarded call (a ``Related``); else False."""
        target = dec.func if isinstance(dec, ast.Call) else dec
        known = final_name(target) in RANK_DECORATORS
        if isinstance(target, ast.Name) and target.id in self.functions:
            owner, fn = self, self.functions[target.id][-1]
        elif self.project is not None and (got := self.project.resolve_expr(self, target)) is not None and \
                got[1] is not None and not isinstance(got[1], ast.ClassDef):
            owner, fn = got
        else:
            return known
        return owner.wrapper_guards_rank(fn) or known

    def wrapper_guards_rank(self, fn: ast.AST):
        """``fn`` is a decorator whose inner function calls the decorated one (its first parameter) only
        under a rank condition, and at least once: that call (a ``Related``), else False."""
        key = ("wrapper_guards_rank", fn)
        if key in self._cache:
            return self._cache[key]
        self._cache[key] = False
        args = getattr(fn, "args", None)
        params = [a.arg for a in (*args.posonlyargs, *args.args)] if args is not None else []
        res = False
        if params:
            wrapped = params[0]
            inner = [s for node, s in self.scopes.items() if node is not fn and
                     self.def_parent.get(node) is fn]
            calls = [(site, s) for s in inner for site in s.sites
                     if isinstance(site.call.func, ast.Name) and site.call.func.id == wrapped]
            if calls and all(self.rank_conds(site.conds, s) for site, s in calls):
                from ddp_doctor.lint.function_summary import Related

                site, s = calls[0]
                cond = ast.unparse(self.rank_conds(site.conds, s)[-1].test)
                res = Related(self.path, site.call.lineno,
                              f"`{getattr(fn, 'name', '?')}` calls the function only where `{cond}` holds")
        self._cache[key] = res
        return res

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

    def call_sites_of(self, fn: ast.AST) -> list[GuardedCall]:
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

    def _sites_named(self, name: str) -> list[GuardedCall]:
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
