"""What the user's source says about a decision: the function holding a line, the arms of an `if`, the
names a test reads, a loop's exits -- stdlib ``ast`` over the file, and lint's model for whether a test
reads the rank.  Reads the user's files (cached per path): the one I/O of the diagnosis."""
from __future__ import annotations

import ast
import functools
import re

from ddp_doctor.evidence import Site
from ddp_doctor.lint.model import ModuleModel

LOOPS = (ast.For, ast.AsyncFor, ast.While)
DEFS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)
RANK_WORDS = re.compile(r"rank|is_main|main_process|is_master|global_zero|local_zero|is_leader|is_zero", re.I)


@functools.lru_cache(maxsize=64)
def parse_file(path: str) -> tuple[ast.Module, tuple[str, ...]] | None:
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read()
        return ast.parse(text), tuple(text.splitlines())
    except (OSError, SyntaxError, ValueError):
        return None


@functools.lru_cache(maxsize=64)
def lint_model(path: str):
    """lint's model of the file (its rank dependence: ``rank == 0`` varies, ``local_rank != -1`` does not)."""
    parsed = parse_file(path)
    try:
        return ModuleModel(parsed[0], path, "\n".join(parsed[1])) if parsed else None
    except Exception:  # noqa: BLE001 - a model that cannot be built: the names decide
        return None


def reads_rank(path: str, fn: ast.AST, test: ast.expr, depth: int = 0) -> bool:
    """Does the test's truth differ between ranks because it reads the rank (per lint's evaluation)?  An
    operand of `and`/`or`/`not` that does is enough: the others (a mode flag lint cannot evaluate) are the
    same on every rank."""
    if isinstance(test, ast.BoolOp):
        return any(reads_rank(path, fn, v, depth) for v in test.values)
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return reads_rank(path, fn, test.operand, depth)
    model = lint_model(path)
    scope = model.scopes.get(fn) if model is not None else None
    if scope is None:
        return any(RANK_WORDS.search(x) for x in names_read(test))
    try:
        if model.varies_by_rank(test, scope):
            return True
    except Exception:  # noqa: BLE001
        return any(RANK_WORDS.search(x) for x in names_read(test))
    if isinstance(test, ast.Call) and any(reads_rank(path, fn, a, depth) for a in test.args):
        return True  # range(40 + rank), min(n, rank_quota(rank))
    return _assigned_from_rank(path, fn, test, depth)


def _assigned_from_rank(path: str, fn: ast.AST, expr: ast.expr, depth: int) -> bool:
    """A name the test reads that the function assigned from a value that reads the rank
    (``batches = 4 if rank == 0 else 3``), two assignments deep at most."""
    if depth >= 2:
        return False
    names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
    return any(isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in node.targets)
               and reads_rank(path, fn, node.value, depth + 1) for node in own_nodes(fn))


def set_on_some_ranks(path: str, fn: ast.AST, test: ast.expr) -> str | None:
    """Why a test's name differs between ranks when it is assigned only inside a branch on the rank
    (``if rank == 0: ... should_stop = bad >= 2``): the other ranks keep the value it had before."""
    names = {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}
    for node in own_nodes(fn):
        if not (isinstance(node, ast.If) and reads_rank(path, fn, node.test)):
            continue
        inside = {t.id for arm in (node.body, node.orelse) for st in arm for n in ast.walk(st)
                  if isinstance(n, (ast.Assign, ast.AugAssign)) for t in (n.targets if isinstance(n, ast.Assign)
                                                                            else [n.target]) if isinstance(t, ast.Name)}
        # computed on every rank somewhere else (not a constant start value like `should_stop = False`)
        outside = {t.id for n in own_nodes(fn) if isinstance(n, (ast.Assign, ast.AugAssign))
                   and not (node.lineno <= n.lineno <= (node.end_lineno or node.lineno))
                   and not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant))
                   for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
        hit = sorted((names & inside) - outside)
        if hit:
            return (f"`{hit[0]}` is set only under `if {ast.unparse(node.test)}:` (line {node.lineno}): the other "
                    "ranks keep the value it had before, so they decide differently. Broadcast it "
                    "(`dist.broadcast_object_list([value], src=0)`) or all_reduce it before testing it.")
    return None


def function_at(tree: ast.Module, name: str | None, line: int) -> ast.AST:
    """The innermost def named ``name`` whose lines hold ``line`` (the module for "<module>"); py-spy names a
    method by its qualified name ("Model.on_train_batch_end")."""
    best: ast.AST = tree
    name = name.rsplit(".", 1)[-1] if name else name
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and name in (node.name, None) \
                and node.lineno <= line <= (node.end_lineno or node.lineno):
            if best is tree or node.lineno > best.lineno:
                best = node
    return best


def own_nodes(fn: ast.AST):
    """The statements of ``fn`` itself (not of the functions and classes defined inside it)."""
    stack = list(ast.iter_child_nodes(fn))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, DEFS):
            stack.extend(ast.iter_child_nodes(node))


def within(node: ast.AST, line: int) -> bool:
    return node.lineno <= line <= (node.end_lineno or node.lineno)


def arm(node: ast.If, line: int) -> str | None:
    if any(within(s, line) for s in node.body):
        return "body"
    if any(within(s, line) for s in node.orelse):
        return "orelse"
    return "test" if within(node, line) else None


def source_of(node: ast.AST, lines: tuple[str, ...]) -> str:
    text = ast.get_source_segment("\n".join(lines), node) or ast.unparse(node)
    return " ".join(text.split())[:120]


def keyword(stmt: ast.stmt) -> str:
    return type(stmt).__name__.lower()


def names_read(test: ast.AST) -> list[str]:
    """The names and attribute chains a test reads (``val_loss``, ``self.rank``), in order, once each."""
    out: list[str] = []
    for node in ast.walk(test):
        name = None
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            name = f"{node.value.id}.{node.attr}"
        elif isinstance(node, ast.Name):
            name = node.id
        if name and name not in out:
            out.append(name)
    return out


def loop_targets(fn: ast.AST) -> set[str]:
    """Loop variables (epoch, step, batch): ranks in different iterations differ there without deciding."""
    out = set()
    for node in own_nodes(fn):
        if isinstance(node, (ast.For, ast.AsyncFor)):
            out |= {n.id for n in ast.walk(node.target) if isinstance(n, ast.Name)}
    return out


# -- the ranks' frames --------------------------------------------------------------------------------


def exits_in(loop: ast.AST):
    """(exit statement, its innermost enclosing `if`) for the `break`s and `return`s that leave ``loop``."""
    out = []

    def walk(node, cond, depth):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, DEFS):
                continue
            if isinstance(child, ast.Return) or (isinstance(child, ast.Break) and depth == 0):
                if cond is not None:
                    out.append((child, cond))
            walk(child, child if isinstance(child, ast.If) else cond,
                 depth + (1 if isinstance(child, LOOPS) else 0))
    walk(loop, None, 0)
    return out


def call_sites(path: str, function: str | None, others: tuple[str, ...] = ()) -> list[Site]:
    """Where the file calls ``function`` (``f(...)``, ``self.f(...)``), and where the files ``others`` call it
    (``f(...)`` imported, ``obj.f(...)`` on an instance), each with the def it is in: the caller frames a rank's
    stack would have shown, read from the source when no stack was taken."""
    out = _calls_in(path, function, own=True)
    for other in others:
        if other != path:
            out += _calls_in(other, function, own=False)
    return out


def _calls_in(path: str, function: str | None, own: bool) -> list[Site]:
    parsed = parse_file(path)
    name = function.rsplit(".", 1)[-1] if function else None
    if parsed is None or not name or name == "<module>":
        return []
    tree, _lines = parsed
    out = []
    for node in ast.walk(tree):
        f = node.func if isinstance(node, ast.Call) else None
        if (isinstance(f, ast.Name) and f.id == name) or (isinstance(f, ast.Attribute) and f.attr == name and (
                not own or isinstance(f.value, ast.Name) and f.value.id == "self")):
            fn = function_at(tree, None, node.lineno)
            out.append(Site(path, node.lineno, fn.name if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef))
                            else "<module>"))
    return out


def continues_in(loop: ast.AST):
    """(`continue` statement, its innermost enclosing `if`) for the `continue`s of ``loop`` itself (not of a
    nested loop): the ways one iteration can skip the rest of its step."""
    out = []

    def walk(node, cond):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, DEFS + LOOPS):
                continue
            if isinstance(child, ast.Continue) and cond is not None:
                out.append((child, cond))
            walk(child, child if isinstance(child, ast.If) else cond)
    for stmt in getattr(loop, "body", []):
        walk(ast.Module(body=[stmt], type_ignores=[]), None)
    return out


def pick_test(cands, path, fn, values_of, sure: bool = False):
    """The decision among candidate tests: one that reads the rank, else one whose values differ between
    the ranks (loop variables aside), else the only candidate; the outermost of equals."""
    loop_vars = loop_targets(fn)
    # a test of loop variables alone is the same on every rank in one iteration: never where they parted
    cands = [n for n in cands if any(x.split(".")[0] not in loop_vars for x in names_read(n.test))]

    def varying(node):
        vals = values_of(node)
        own = [n for n in names_read(node.test) if n not in loop_vars]
        per = [tuple(v for k, v in kv if k in own) for _r, kv in vals]
        return len(per) > 1 and len(set(per)) > 1

    for pick in (lambda n: reads_rank(path, fn, n.test), varying):
        hits = [n for n in cands if pick(n)]
        if hits:
            return min(hits, key=lambda n: n.lineno)
    return cands[0] if len(cands) == 1 and not sure else None


def under_rank_branch(site: Site, files: tuple[str, ...] = (), depth: int = 0) -> bool:
    """Is ``site``'s line inside an arm of an `if` whose test reads the rank (``if rank == 0:``)?  With ``files``
    (the job's own), also a line of a helper whose every call, in its file and those files, is such a line,
    three calls deep (``if rank == 0: run_eval(model, x)``)."""
    parsed = parse_file(site.path)
    if parsed is None:
        return False
    fn = function_at(parsed[0], site.function, site.line)
    if any(isinstance(n, ast.If) and arm(n, site.line) in ("body", "orelse") and reads_rank(site.path, fn, n.test)
           for n in own_nodes(fn)):
        return True
    calls = call_sites(site.path, site.function, files) if files and depth < 3 else []
    return bool(calls) and all(under_rank_branch(c, files, depth + 1) for c in calls)
