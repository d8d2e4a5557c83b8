"""Control flow: which conditions and loops enclose each statement and call, early exits
(`if C: return` makes the rest of the block run under `not C`) and jumps."""
from __future__ import annotations

import ast
from typing import Iterator

from ddp_doctor.lint.names import dotted, final_name
from ddp_doctor.lint.scopes import Cond, FuncNode, GuardedCall, Jump, LoopNode, Scope


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


class ControlFlow:
    """Mixin of :class:`~ddp_doctor.lint.model.ModuleModel`: the statement walk that records sites,
    jumps, loops and the conditions each runs under."""

    def _walk(self, scope: Scope, body: list[ast.stmt], conds: tuple[Cond, ...], loops: tuple[ast.stmt, ...]) -> None:
        for stmt in body:
            scope.stmts.append((stmt, conds, loops))
            for expr in iter_header_exprs(stmt):
                for call in calls_in(expr):
                    scope.sites.append(GuardedCall(call, conds, loops, stmt, scope))
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

    def returns_of(self, fn: ast.AST) -> list[ast.Return]:
        scope = self.scopes.get(fn)
        return [j.stmt for j in scope.jumps if j.kind == "return"] if scope is not None else []


def under_join(model, scope: Scope, node: ast.AST) -> bool:
    """Is ``node`` inside ``with model.join():`` / ``with Join([...]):`` (DDP's Join for uneven inputs)?  There
    the ranks legitimately run different numbers of steps: the joined rank shadows the others' all-reduces."""
    def compute():
        inside: set[int] = set()
        for w in ast.walk(scope.node):
            if isinstance(w, (ast.With, ast.AsyncWith)) and any(
                    isinstance(it.context_expr, ast.Call) and final_name(it.context_expr.func) in ("join", "Join")
                    for it in w.items):
                inside.update(id(n) for stmt in w.body for n in ast.walk(stmt))
        return inside
    key = ("under_join", id(scope.node))
    if key not in model._cache:
        model._cache[key] = compute()
    return id(node) in model._cache[key]
