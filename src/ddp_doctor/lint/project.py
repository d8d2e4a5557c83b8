"""Cross-file analysis: a file's imports resolved to the other files of its project, and summaries of
the functions there, used at call sites in this file.

A training repository spreads one job over files: the loop in ``engine.py``, the loader built by
``build_loader()`` in ``datasets/__init__.py``, the rank helpers (``is_main_process()``,
``comm.synchronize()``) in ``utils/``.  :class:`Project` resolves ``import a.b``, ``from .engine import
f``, ``from pkg import mod`` and aliases to files under the linted roots (never to installed packages),
builds their :class:`~ddp_doctor.lint.model.ModuleModel` on demand, and answers per function with a
:class:`FunctionSummary`: the collectives it enters, whether it runs a backward, which parameters it
calls as a model, what it returns (a loader, a sampler, a DDP model, the rank).  Models and summaries
are cached by file content hash, so a file shared by many others is read and summarised once per run.
"""
from __future__ import annotations

import ast
import hashlib
import os
import re
from collections import OrderedDict
from pathlib import Path
from typing import TYPE_CHECKING

from ddp_doctor.lint.callers import Caller, CallerIndex, package_methods
from ddp_doctor.lint.function_summary import FunctionSummary, Related
from ddp_doctor.lint.function_summary import summarise as _summarise
from ddp_doctor.lint.scopes import Scope

if TYPE_CHECKING:
    from ddp_doctor.lint.model import ModuleModel

_DIST_TEXT = re.compile(r"torch\.distributed|import distributed|DistributedDataParallel|DistributedSampler|"
                        r"\blightning|accelerate|deepspeed|horovod|torch\.multiprocessing")
_SUMMARY_TEXT = re.compile(r"distributed|Distributed|backward|torch\.save|DataLoader|Sampler|rank|barrier|all_reduce|"
                           r"all_gather|broadcast|lightning|accelerat|fabric|deepspeed|horovod|register_buffer|"
                           r"BatchNorm|Dataset|set_device|device_mesh|DeviceMesh|setup\(|^from \.|^\s+from \.|"
                           # an evaluation helper that runs the model it is handed says no word above
                           r"no_grad|inference_mode|\.eval\(\)", re.M)
# libraries whose APIs the catalogue knows by qualified name (torch.distributed.barrier, DDP, Fabric,
# accelerate): even when the linted tree is their own source, calls into them are not followed
_MODELLED = {"torch", "torchvision", "lightning", "pytorch_lightning", "lightning_fabric", "accelerate",
             "deepspeed", "apex", "horovod", "transformers", "numpy"}
_MAX_DEPTH = 3  # calls followed through other files
_MAX_ANCESTORS = 6  # directories above a file searched for an absolute import's top package

# models kept for resolution, least recently used dropped: memory stays bounded on a large tree
_MAX_MODELS = 128
# summaries by content hash, shared by every Project of this process (pre-commit and flake8 lint many
# files); they hold locations and names only, never a model
_SUMMARIES: dict[tuple[str, str, str, int], "FunctionSummary"] = {}


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()


class Project:
    """The files under ``roots`` (the linted directories, and the folders of the linted files)."""

    def __init__(self, roots=()):
        self.roots = [Path(os.path.realpath(r)) for r in roots]
        self._by_path: OrderedDict[str, "ModuleModel | None"] = OrderedDict()
        self._resolving: set = set()
        self._files: dict[tuple[Path, int, str], Path | None] = {}
        self._relevant: dict[tuple[str, str], bool] = {}
        self._listings: dict[Path, frozenset] = {}
        self._dropped: list["ModuleModel"] = []  # models out of the cache, released between files
        self._callers = CallerIndex(self)
        # answers that hold other files' models (their call sites): forgotten whenever a model is released
        self._caller_args: dict[tuple[int, str], tuple[ast.AST, list[tuple[ast.expr, Scope]]]] = {}

    # --------------------------------------------------------------- files
    def built(self, path: str, source: str) -> "ModuleModel | None":
        """The model already built for this file with this content (another file imported it first)."""
        model = self._by_path.get(os.path.realpath(path))
        return model if model is not None and model.source == source else None

    def register(self, model: "ModuleModel") -> None:
        """A model the engine built for a linted file: reuse it, and give it this project."""
        model.project = self
        if model.path and model.path != "<string>":
            self._keep(os.path.realpath(model.path), model)

    def _keep(self, real: str, model: "ModuleModel | None") -> None:
        old = self._by_path.get(real)
        if old is not None and old is not model:
            self._dropped.append(old)
        self._by_path[real] = model
        self._by_path.move_to_end(real)
        while len(self._by_path) > _MAX_MODELS:
            _path, gone = self._by_path.popitem(last=False)
            if gone is not None:
                self._dropped.append(gone)

    def release_dropped(self, everything: bool = False) -> None:
        """Release the models dropped from the cache (or all of them, when the run is over).  Called
        between files, when no analysis holds a model: a dropped model may still be in use while the
        file that imported it is being linted."""
        if everything:
            self._dropped.extend(m for m in self._by_path.values() if m is not None)
            self._by_path.clear()
        if not self._dropped:
            return
        self._caller_args.clear()
        kept = {id(m) for m in self._by_path.values() if m is not None}
        for m in self._dropped:
            if id(m) not in kept:
                m.release()
        self._dropped = []

    def within(self, path: Path) -> bool:
        return any(path == r or r in path.parents for r in self.roots)

    def model_at(self, path: Path, any_text: bool = False) -> "ModuleModel | None":
        """The model of a project file, or None when its text shows nothing a summary could hold (no
        collective, backward, loader, sampler, rank or DDP word: most files of a large tree).
        ``any_text``: whatever the text (its imports are what is asked about)."""
        real = os.path.realpath(path)
        if real not in self._by_path and not real.endswith("__init__.py") and not any_text and \
                not self._relevant_file(Path(real), _SUMMARY_TEXT, "summary"):
            return None
        if real in self._by_path:
            self._by_path.move_to_end(real)
            return self._by_path[real]
        self._keep(real, None)  # a cycle of imports ends here
        from ddp_doctor.lint.engine import read_source
        from ddp_doctor.lint.model import ModuleModel

        text, err = read_source(Path(real))
        if text is None:
            return None
        try:
            model = ModuleModel(ast.parse(text, real), real, text)
        except (SyntaxError, ValueError, RecursionError):
            return None
        model.project = self
        self._keep(real, model)
        return model

    def _module_file(self, base: Path, dotted: str) -> Path | None:
        parts = dotted.split(".") if dotted else []
        d = base
        for part in parts[:-1]:  # walk the packages by directory listings (cached), not by stat calls
            if part not in self._entries(d):
                return None
            d = d / part
        if parts:
            last = parts[-1]
            entries = self._entries(d)
            if last + ".py" in entries and (d / (last + ".py")).is_file():
                return d / (last + ".py")
            if last not in entries:
                return None
            d = d / last
        init = d / "__init__.py"
        return init if "__init__.py" in self._entries(d) and init.is_file() else None

    def _entries(self, d: Path) -> frozenset:
        got = self._listings.get(d)
        if got is None:
            try:
                got = frozenset(os.listdir(d))
            except OSError:
                got = frozenset()
            self._listings[d] = got
        return got

    def imports_relevant(self, path: str, tree: ast.Module, relevant) -> bool:
        """Does the file at ``path`` import a project module whose text matches ``relevant`` (a file that
        only says ``from ..utils import comm`` still runs comm's barriers)?"""
        here = Path(os.path.realpath(path)).parent
        for node in tree.body:
            if isinstance(node, ast.Import):
                targets = [(0, a.name) for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                targets = [(node.level, base)] + [(node.level, f"{base}.{a.name}" if base else a.name)
                                                  for a in node.names if a.name != "*"]
            else:
                continue
            for level, module in targets:
                f = self._lookup(here, level, module)
                if f is not None and self._relevant_file(f, relevant):
                    return True
        return False

    def imports_distributed(self, model: "ModuleModel") -> bool:
        """Does ``model`` import a project module that uses torch.distributed, DDP, Fabric, accelerate,
        Lightning, ...?  Read from the imported file's text: no model is built for it."""
        for level, module in model.import_modules:
            f = self.module_file(model, level, module)
            if f is not None and os.path.realpath(f) != os.path.realpath(model.path) and \
                    self._relevant_file(f, _DIST_TEXT, "dist"):
                return True
        return False

    def _relevant_file(self, path: Path, relevant, kind: str = "relevant") -> bool:
        key = (kind, str(path))
        if key not in self._relevant:
            from ddp_doctor.lint.engine import read_source

            text, _err = read_source(path)
            self._relevant[key] = bool(text) and bool(relevant.search(text))
        return self._relevant[key]

    def module_file(self, importer: "ModuleModel", level: int, module: str) -> Path | None:
        """The file of module ``module`` imported from ``importer`` (``level`` dots), inside the project."""
        here = importer._cache.get("project_dir")
        if here is None:
            here = importer._cache["project_dir"] = Path(os.path.realpath(importer.path)).parent
        return self._lookup(here, level, module)

    def _lookup(self, here: Path, level: int, module: str) -> Path | None:
        if not level and module.split(".", 1)[0] in _MODELLED:
            return None  # matched by qualified name from the catalogue, never re-read from its source
        key = (here, level, module)
        if key not in self._files:
            self._files[key] = self._find_module(here, level, module)
        return self._files[key]

    def _find_module(self, here: Path, level: int, module: str) -> Path | None:
        if level:
            base = here
            for _ in range(level - 1):
                base = base.parent
            found = self._module_file(base, module)
            return found if found is not None and self.within(found) else None
        bases = []
        d = here
        for _ in range(_MAX_ANCESTORS):  # the folders above, up to the one holding the top package
            bases.append(d)
            if not self.within(d) or d.parent == d:
                break
            d = d.parent
        bases += [r for r in self.roots if r not in bases]
        for base in bases:
            found = self._module_file(base, module)
            if found is not None and self.within(found):
                return found
        return None

    # ---------------------------------------------------------- resolution
    def resolve_local(self, model: "ModuleModel", name: str, depth: int = 0):
        """What the imported name ``name`` of ``model`` is: (module model, def or class node), or
        (module model, None) for a module; None when it is not a file of this project."""
        entry = model.import_from.get(name)
        if entry is None or depth > _MAX_DEPTH:
            return None
        key = ("project_local", name)
        got = model._cache.get(key)
        if got is not None and got[0].released:  # the model it named was dropped and released since
            del model._cache[key]
        if key not in model._cache:
            model._cache[key] = None  # an import cycle resolves to nothing
            model._cache[key] = self._resolve_local(model, name, entry, depth)
        return model._cache[key]

    def _resolve_local(self, model: "ModuleModel", name: str, entry, depth: int):
        level, module, attr = entry
        if attr is None:  # `import a.b` / `import a.b as c`
            f = self.module_file(model, 0, module)
            m = self.model_at(f) if f is not None else None
            return (m, None) if m is not None else None
        f = self.module_file(model, level, module)
        owner = self.model_at(f) if f is not None else None
        if owner is not None:
            got = self._member(owner, attr, depth)
            if got is not None:
                return got
        sub = self.module_file(model, level, f"{module}.{attr}" if module else attr)  # from pkg import mod
        m = self.model_at(sub) if sub is not None else None
        return (m, None) if m is not None else None

    def _member(self, owner: "ModuleModel", attr: str, depth: int):
        defs = [d for d in owner.functions.get(attr, []) if owner.def_parent.get(d) is owner.tree]
        if defs:
            return owner, defs[-1]
        if attr in owner.classes:
            return owner, owner.classes[attr]
        if attr in owner.import_from:  # re-exported: `from .engine import train_one_epoch` in __init__.py
            return self.resolve_local(owner, attr, depth + 1)
        return None

    def resolve_expr(self, model: "ModuleModel", expr: ast.expr, depth: int = 0):
        """``f`` / ``mod.f`` / ``pkg.mod.f`` / ``mod.Class`` to (module model, node or None)."""
        if depth > _MAX_DEPTH:
            return None
        if isinstance(expr, ast.Name):
            if expr.id in model.functions or expr.id in model.classes:
                return None  # defined here: the same-file analysis handles it
            return self.resolve_local(model, expr.id)
        if isinstance(expr, ast.Attribute):
            base = self.resolve_expr(model, expr.value, depth + 1)
            if base is None or base[1] is not None:
                return None
            owner = base[0]
            got = self._member(owner, expr.attr, depth)
            if got is not None:
                return got
            sub = self.module_file(owner, 1, expr.attr)  # pkg.mod with pkg/__init__.py not importing mod
            m = self.model_at(sub) if sub is not None and Path(owner.path).name == "__init__.py" else None
            return (m, None) if m is not None else None
        return None

    def resolve_call(self, model: "ModuleModel", func: ast.expr, scope: Scope):
        """The function (or class, whose ``__init__`` is meant) of another project file ``func`` calls."""
        if not model.import_from:
            return None
        root = func
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id == "self" and isinstance(func, ast.Attribute) and root is func.value:
            return self._resolve_method(model, func, scope)
        if not isinstance(root, ast.Name) or root.id in scope.params:
            return None
        if root.id not in model.import_from:
            return self._resolve_method(model, func, scope)
        got = self.resolve_expr(model, func)
        if got is None or got[1] is None:
            return None
        return got

    def _resolve_method(self, model: "ModuleModel", func: ast.expr, scope: Scope):
        """``saver.save(...)`` / ``self.saver.save(...)`` where the receiver was built from a class of another
        project file (``saver = Checkpointer(out)``): that class's method (its own or a base class's of
        the same file)."""
        if not isinstance(func, ast.Attribute):
            return None
        if isinstance(func.value, ast.Name) and func.value.id == "self" and scope.cls is not None:
            # `self.validate()` inherited from a base class of another project file (a trainer's mixin)
            if func.attr in model.methods.get(scope.cls, {}):
                return None  # its own method: the same-file analysis has it
            for b in scope.cls.bases:
                got = self.resolve_expr(model, b) if isinstance(b, (ast.Name, ast.Attribute)) else None
                if got is not None and isinstance(got[1], ast.ClassDef):
                    meth = got[0].methods.get(got[1], {}).get(func.attr)
                    if meth is not None:
                        return got[0], meth
            return None
        for v in model.values_of(func.value, scope)[:4]:
            # the class is named by an import (`Checkpointer(...)`, `ckpt.Checkpointer(...)`), never by
            # another method's result (`x = x.to(device)` would chase itself)
            if not isinstance(v, ast.Call) or not isinstance(v.func, (ast.Name, ast.Attribute)):
                continue
            root = v.func
            while isinstance(root, ast.Attribute):
                root = root.value
            if not isinstance(root, ast.Name) or root.id not in model.import_from:
                continue
            got = self.resolve_call(model, v.func, scope)
            if got is None or not isinstance(got[1], ast.ClassDef):
                continue
            owner, cls = got
            for c in [cls, *(owner.classes.get(b.id) for b in cls.bases if isinstance(b, ast.Name))]:
                meth = owner.methods.get(c, {}).get(func.attr) if c is not None else None
                if meth is not None:
                    return owner, meth
        return None

    def callers_of(self, owner: "ModuleModel", fn: ast.AST) -> list[Caller]:
        """The calls of ``fn`` (a module-level function or class constructor of ``owner``) in the
        project's other files."""
        return self._callers.callers(owner, fn)

    def shows(self, fact: str) -> bool | None:
        """A whole-program fact: does any file under the roots show it (``"sets_device"``)?"""
        return self._callers.shows(fact)

    def importer_shows(self, owner: "ModuleModel", fact: str, confirm=None) -> Related | None:
        """A project file that imports ``owner`` (or its package) and shows ``fact`` (``confirm(model)``: on its
        parsed text too): where it imports it."""
        return self._callers.importer_shows(owner, fact, confirm)

    def caller_args(self, owner: "ModuleModel", fn: ast.AST, idx: int, name: str) -> list[tuple[ast.expr, Scope]]:
        """(argument, its scope) passed for parameter ``name`` (position ``idx``) of ``fn`` by the
        callers in other files (``Trainer(model, device_id)`` in the launching script)."""
        from ddp_doctor.lint.names import arg_or_kw

        key = (id(fn), name)
        got = self._caller_args.get(key)
        if got is not None and got[0] is fn:
            return got[1]
        out = []
        for c in self.callers_of(owner, fn):
            arg = arg_or_kw(c.site.call, idx, name)
            if arg is not None:
                out.append((arg, c.site.scope))
        self._caller_args[key] = (fn, out)
        return out

    def method_backward(self, owner: "ModuleModel", node: ast.AST, attr: str) -> Related | None:
        """Does method ``attr`` of the object that ``node`` (a class, or a factory function of ``owner``)
        builds run a backward?  A class's own method; for a factory, the methods of that name in its
        package (``create_model(opt)`` picks the class by name at run time)."""
        key = ("method_backward", id(node), attr)
        got = owner._cache.get(key)
        if got is not None and got[0] is node:
            return got[1]
        owner._cache[key] = (node, None)  # a cycle of factories ends here
        if isinstance(node, ast.ClassDef) and attr in owner.methods.get(node, {}):
            cands = [(owner, owner.methods[node][attr])]
        else:
            cands = package_methods(self, owner, attr)
        res = next((s.backward for m, fn in cands if (s := self.summary(m, fn)).backward is not None), None)
        owner._cache[key] = (node, res)
        return res

    # ----------------------------------------------------------- summaries
    def summary_of_call(self, model: "ModuleModel", func: ast.expr, scope: Scope) -> FunctionSummary | None:
        if not model.import_from:
            return None
        key = ("project_call", id(func), id(scope))
        got = model._cache.get(key)
        if got is not None and got[0] is func:
            return got[1]
        res = self._summary_of_call(model, func, scope)
        model._cache[key] = (func, res)  # holding func keeps its id from being reused
        return res

    def _summary_of_call(self, model: "ModuleModel", func: ast.expr, scope: Scope) -> FunctionSummary | None:
        got = self.resolve_call(model, func, scope)
        if got is None:
            return None
        owner, node = got
        if isinstance(node, ast.ClassDef):
            node = owner.methods.get(node, {}).get("__init__")
            if node is None:
                return None
        return self.summary(owner, node)

    def collectives_of_call(self, model: "ModuleModel", func: ast.expr, scope: Scope) -> list[Related]:
        s = self.summary_of_call(model, func, scope)
        return list(s.collectives) if s is not None else []

    def summary(self, owner: "ModuleModel", fn: ast.AST) -> FunctionSummary:
        digest = owner._cache.get("digest")
        if digest is None:
            digest = owner._cache["digest"] = _digest(owner.source)
        # the path too: a summary names its file (Related), and two copies of one file are two places
        key = (digest, owner.path, getattr(fn, "name", ""), fn.lineno)
        got = _SUMMARIES.get(key)
        if got is not None:
            return got
        if key in self._resolving:  # recursion through other files: nothing more to learn
            return FunctionSummary(owner.path, getattr(fn, "name", "?"), ())
        self._resolving.add(key)
        try:
            got = _summarise(self, owner, fn)
        finally:
            self._resolving.discard(key)
        _SUMMARIES[key] = got
        return got
