"""Who calls a function from another file of the project: the reverse of :mod:`ddp_doctor.lint.project`'s
import resolution.

A value often enters a function from a caller in another file: the launching script reads
``LOCAL_RANK`` and passes it to ``Trainer(model, device_id)`` defined in ``trainer.py``, whose
``if self.device_id <= 0:`` then guards a barrier.  Linting ``trainer.py`` needs those call sites.

The index is built once per process and roots, on the first question, from the text of every file
under the project's roots (no parse): the names its import statements bring in (name -> the files that
import it), and the whole-program facts (``_FACTS``: some file sets the device, runs a process group,
reads a node index).  Only the few files that import the function's name or its module, nearest
first, are then parsed (through the project's model cache) and their calls or imports resolved back
to the module.  The same index answers "which file imports this module" (one file in between
allowed) and "which method of this package has that name".  A long-lived process that edits files
under the same roots keeps the first index (the lint CLI, pre-commit and flake8 runs are short).
"""
from __future__ import annotations

import ast
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ddp_doctor.lint.function_summary import Related

if TYPE_CHECKING:
    from ddp_doctor.lint.model import ModuleModel
    from ddp_doctor.lint.project import Project
    from ddp_doctor.lint.scopes import GuardedCall

_IMPORT = re.compile(r"^[ \t]*(?:from[ \t]+([.\w]+)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;]*)|import[ \t]+([^\n#;]+))",
                     re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")
_CALLED = re.compile(r"([A-Za-z_]\w*)\s*\(")
# how a caller gets hold of the rank (a name, an environment variable, an API, a spawned worker's index)
_RANKISH = ("rank", "RANK", "Rank", "ordinal", "process_index", "LOCALID", "PROCID", "is_main", "is_master",
            "spawn")
_MAX_FILES = 50_000  # a project larger than this is not indexed (the answer is then: no other callers)
_MAX_CANDIDATES = 12  # importing files parsed per question
_MAX_SITES = 8
_MAX_HOPS = 4  # importers whose own importers are looked at (one file in between)
# whole-program facts read from every file's text in the same pass
# (plain substrings: a regular expression over every file of the torch tree cost seconds)
_FACTS = {"sets_device": ("set_device(", "CUDA_VISIBLE_DEVICES", "torch.cuda.device(", "DeviceMesh(",
                         "init_device_mesh("),
          "dist_script": ("init_process_group(", "DistributedDataParallel", "DDP("),
          "multi_node": ("node_rank", "NODE_RANK", "nnodes", "num_nodes", "n_nodes", "SLURM_NODEID", "GROUP_RANK")}
_INDEXES: dict[tuple[str, ...], tuple] = {}  # roots -> (words, facts, called names): one per process
_MAX_INDEXES = 8
_MAX_PACKAGE_FILES = 64  # files of one package searched for a method by name
# a caller file larger than this is not parsed for the question: launching scripts and trainers are
# far smaller, the giants are test suites and generated modules (parsing them cost seconds on torch)
_MAX_BYTES = 128 * 1024


@dataclass(frozen=True)
class Caller:
    """A call of the function from another project file, and the model it is in."""

    model: "ModuleModel"
    site: "GuardedCall"


class CallerIndex:
    """Name -> the project files whose import statements name it (built on the first question)."""

    def __init__(self, project: "Project"):
        self.project = project
        self._by_word: dict[str, list[str]] | None = None
        self._facts: dict[str, set[str]] | None = None  # fact (_FACTS) -> the files showing it; None: too large
        self._answers: dict[tuple[str, str, int], tuple[str, ...]] = {}
        # the names a file calls, for the files that can pass a rank (the only callers looked for)
        self._called: dict[str, frozenset | None] = {}

    def _ensure(self) -> None:
        """Build the index, or take the one this process built for the same roots (flake8 and pre-commit
        lint file by file, each with a project of its own)."""
        if self._by_word is not None:
            return
        key = tuple(str(r) for r in self.project.roots)
        got = _INDEXES.get(key)
        if got is None:
            by_word = self._build()
            got = _INDEXES[key] = (by_word, self._facts, self._called)
            while len(_INDEXES) > _MAX_INDEXES:
                del _INDEXES[next(iter(_INDEXES))]
        self._by_word, self._facts, self._called = got

    def _build(self) -> dict[str, list[str]]:
        from ddp_doctor.lint.engine import SKIP_DIRS, read_source

        index: dict[str, list[str]] = {}
        facts: dict[str, set[str]] = {k: set() for k in _FACTS}
        seen = 0
        for root in self.project.roots:
            for d, dirs, names in os.walk(root):
                dirs[:] = sorted(x for x in dirs if x not in SKIP_DIRS and not x.startswith("."))
                for n in names:
                    if not n.endswith(".py"):
                        continue
                    seen += 1
                    if seen > _MAX_FILES:
                        return index
                    path = os.path.join(d, n)
                    text, _err = read_source(Path(path))
                    if not text or "import" not in text:
                        continue
                    real = os.path.realpath(path)
                    for k, words in _FACTS.items():
                        if any(w in text for w in words):
                            facts[k].add(real)
                    words: set[str] = set()
                    for m in _IMPORT.finditer(text):
                        for part in m.groups():
                            if part:
                                words.update(_WORD.findall(part))
                    for w in words:
                        index.setdefault(w, []).append(real)
                    if len(text) <= _MAX_BYTES and any(w in text for w in _RANKISH):
                        self._called[real] = None  # can pass a rank: its called names are read if asked
        self._facts = facts
        return index

    def shows(self, fact: str) -> bool | None:
        """Does some file of the project show ``fact`` (a key of ``_FACTS``)?  None when the project was
        too large to read."""
        self._ensure()
        return None if self._facts is None else bool(self._facts[fact])

    def importer_shows(self, owner: "ModuleModel", fact: str, confirm=None) -> Related | None:
        """A file that imports ``owner``'s module, or its package, and shows ``fact`` (the launcher that
        sets the device before it builds the model class of ``models/pix_model.py``; the DDP trainer
        that calls the checkpoint utility): where it imports it, or None.  One file in between counts
        too (``train.py`` -> ``engine.py`` -> ``utils/checkpoint.py``): the import named is then the
        first hop's.  The fact is read from the file's words; ``confirm(model)`` checks it on the parsed
        file (a DDP class named in an ``isinstance`` test is no distributed script)."""
        self._ensure()
        if not self._facts:
            return None
        here, words = os.path.realpath(owner.path), self._facts[fact]

        def shows(q: str) -> bool:
            if q not in words:
                return False
            if confirm is None:
                return True
            m = self.project.model_at(Path(q), any_text=True)
            return m is not None and bool(confirm(m))

        for p, line in self._importers(here, shows)[:1]:
            return Related(p, line, f"`{Path(p).name}` imports it")
        for p, line in self._importers(here, lambda q: not shows(q))[:_MAX_HOPS]:
            for q, _line in self._importers(p, shows)[:1]:
                return Related(p, line, f"`{Path(p).name}` imports it, and `{Path(q).name}` imports "
                                        f"`{Path(p).name}`")
        return None

    def _importers(self, path: str, keep) -> list[tuple[str, int]]:
        """(file, line) of the project files that import the module at ``path`` or its package, among
        those ``keep`` accepts (their words matched; each import is resolved to be sure)."""
        here = Path(path)
        targets = {str(here)}
        names = [here.stem if here.name != "__init__.py" else here.parent.name]
        if here.name != "__init__.py" and _package_loads(here):
            names.append(here.parent.name)
            targets.add(str(here.parent / "__init__.py"))
        cands = dict.fromkeys(p for n in names for p in self._by_word.get(n, ()) if keep(p))
        cands.pop(str(here), None)
        out = []
        for p in _nearest(str(here), cands)[:_MAX_CANDIDATES]:
            m = self.project.model_at(Path(p), any_text=True)
            for node in m.tree.body if m is not None else ():
                if isinstance(node, (ast.Import, ast.ImportFrom)) and targets & self._resolved(m, node):
                    out.append((p, node.lineno))
                    break
        return out

    def _resolved(self, m: "ModuleModel", node: ast.stmt) -> set[str]:
        if isinstance(node, ast.Import):
            mods = [(0, a.name) for a in node.names]
        else:
            base = node.module or ""
            mods = [(node.level, base)] + [(node.level, f"{base}.{a.name}" if base else a.name) for a in node.names]
        out = set()
        for level, mod in mods:
            f = self.project.module_file(m, level, mod)
            if f is not None:
                out.add(os.path.realpath(f))
        return out

    def callers(self, owner: "ModuleModel", fn: ast.AST) -> list[Caller]:
        """The call sites of ``fn`` (a module-level def, or a module-level class's ``__init__``: then
        the calls of the class) in the other files of the project."""
        name, node = _callable_name(owner, fn)
        if name is None or not owner.path or owner.path == "<string>":
            return []
        here = os.path.realpath(owner.path)
        key = (here, name, node.lineno)
        paths = self._answers.get(key)
        if paths is None:
            paths = self._answers[key] = tuple(self._find(owner, here, name))
        out: list[Caller] = []
        for p in paths:
            m = self.project.model_at(Path(p))
            if m is None:
                continue
            out += [Caller(m, s) for s in _sites_calling(self.project, m, name, here, node)]
            if len(out) >= _MAX_SITES:
                break
        return out[:_MAX_SITES]

    def _called_names(self, path: str) -> frozenset:
        """The names ``path`` calls (read on the first question that makes it a candidate)."""
        got = self._called.get(path)
        if got is None:
            from ddp_doctor.lint.engine import read_source

            text, _err = read_source(Path(path))
            got = self._called[path] = frozenset(_CALLED.findall(text or ""))
        return got

    def _find(self, owner: "ModuleModel", here: str, name: str) -> list[str]:
        self._ensure()
        stem = Path(here).stem if Path(here).name != "__init__.py" else Path(here).parent.name
        cands = dict.fromkeys(self._by_word.get(name, []) + self._by_word.get(stem, []))
        cands.pop(here, None)
        found = []
        for p in [p for p in _nearest(here, cands) if p in self._called and name in self._called_names(p)][
                :_MAX_CANDIDATES]:
            m = self.project.model_at(Path(p))
            if m is not None and _sites_calling(self.project, m, name, here, None):
                found.append(p)
        return found


def _nearest(here: str, paths) -> list[str]:
    """``paths`` nearest first (the longest folder path shared with ``here``): in a large repository the
    files that use a module sit around it, and the candidates kept under the cap should be those."""
    parts = here.split(os.sep)

    def shared(p: str) -> int:
        n = 0
        for a, b in zip(parts, p.split(os.sep)):
            if a != b:
                break
            n += 1
        return n
    return sorted(paths, key=lambda p: -shared(p))


def _package_loads(module: Path) -> bool:
    """Importing the package of ``module`` runs it: its ``__init__.py`` names the module, or loads
    modules by name at run time (``importlib.import_module("models." + name)``).  An empty
    ``__init__.py`` does not (``from util import box_ops`` does not load ``util/plot_utils.py``)."""
    from ddp_doctor.lint.engine import read_source

    init = module.parent / "__init__.py"
    if not init.is_file():
        return False
    text, _err = read_source(init)
    return bool(text) and (module.stem in text or "import_module" in text or "__import__" in text)


def _callable_name(owner: "ModuleModel", fn: ast.AST) -> tuple[str | None, ast.AST]:
    parent = owner.def_parent.get(fn)
    if parent is owner.tree:
        return getattr(fn, "name", None), fn
    if isinstance(parent, ast.ClassDef) and getattr(fn, "name", "") == "__init__" and \
            owner.classes.get(parent.name) is parent:
        return parent.name, parent
    return None, fn


def _sites_calling(project: "Project", m: "ModuleModel", name: str, path: str, node: ast.AST | None) -> list:
    out = []
    for site in m._sites_named(name):
        got = project.resolve_call(m, site.call.func, site.scope)
        if got is None or os.path.realpath(got[0].path) != path:
            continue
        if node is None or (got[1].lineno == node.lineno and getattr(got[1], "name", None) == name):
            out.append(site)
    return out


def package_methods(project: "Project", owner: "ModuleModel", attr: str) -> list[tuple["ModuleModel", ast.AST]]:
    """The methods named ``attr`` of the classes in ``owner``'s folder (its package): where the object
    that ``owner``'s factory builds by name (``importlib.import_module("models." + name)``) comes from."""
    from ddp_doctor.lint.engine import read_source

    here = Path(os.path.realpath(owner.path)).parent
    defined = re.compile(rf"^[ \t]+def[ \t]+{re.escape(attr)}[ \t]*\(", re.M)
    out = []
    try:
        names = sorted(n for n in os.listdir(here) if n.endswith(".py"))
    except OSError:
        return []
    for n in names[:_MAX_PACKAGE_FILES]:
        text, _err = read_source(here / n)
        if not text or not defined.search(text):
            continue
        m = project.model_at(here / n)
        if m is None:
            continue
        for methods in m.methods.values():
            if attr in methods:
                out.append((m, methods[attr]))
    return out
