"""The semantic model of one module: imports, scopes, rank conditions, loops, DDP objects.

Pure stdlib ``ast``; never imports torch.  Rules ask this model questions
("is this call a collective?", "under which rank conditions does this statement
run?", "which DataLoader does this loop iterate?") instead of matching strings.

One concern per module, joined here:

* :mod:`~ddp_doctor.lint.names`: the catalogue of known APIs and rank-ish names;
* :mod:`~ddp_doctor.lint.scopes`: scopes, imports, defs, call sites, name resolution;
* :mod:`~ddp_doctor.lint.flow`: control flow (enclosing conditions and loops, early exits, jumps);
* :mod:`~ddp_doctor.lint.values`: value flow (assignments, what kind of object a value is);
* :mod:`~ddp_doctor.lint.rank` and :mod:`~ddp_doctor.lint.evaluate`: rank dependence;
* :mod:`~ddp_doctor.lint.summaries`: whole-module facts (distributed? wraps a model in DDP?).

Rank conditions are decided by *evaluating* the condition for ranks 0..3 of a
world of 4, with every non-rank unknown (``args.distributed``, ``ngpus``) given
the same value on every rank (it is rank-independent by construction), trying a
few values for each.  A condition is rank-dependent when, for some such choice,
its truth differs between ranks.  So ``args.local_rank != -1`` (the classic
"are we distributed" test) is *not* a rank condition, ``rank % ngpus == 0`` is.
"""
from __future__ import annotations

import ast
from typing import Any

from ddp_doctor.lint.flow import ControlFlow
from ddp_doctor.lint.rank import RankDependence
from ddp_doctor.lint.scopes import Scope, ScopeIndex
from ddp_doctor.lint.summaries import ModuleSummary
from ddp_doctor.lint.values import ValueFlow


class ModuleModel(ScopeIndex, ControlFlow, ValueFlow, RankDependence, ModuleSummary):
    """Everything the rules need to know about one parsed module."""

    def __init__(self, tree: ast.Module, path: str = "<string>", source: str = ""):
        self.tree = tree
        self.path = path
        self.source = source
        self.imports: dict[str, str] = {}
        # local name -> (relative level, module, imported name or None for `import a.b`): for the project
        self.import_from: dict[str, tuple[int, str, str | None]] = {}
        self.import_modules: list[tuple[int, str]] = []  # every module an import statement names (level, name)
        self.scopes: dict[ast.AST, Scope] = {}
        self.functions: dict[str, list[ast.AST]] = {}  # module-level and nested defs by name
        self.methods: dict[ast.ClassDef, dict[str, ast.AST]] = {}
        self.self_assigns: dict[ast.ClassDef, dict[str, list[ast.expr]]] = {}
        self.value_scope: dict[int, "Scope"] = {}  # id(value of a self.attr assignment) -> its scope
        self.classes: dict[str, ast.ClassDef] = {}
        self.has_main_guard = False
        self._cache: dict[Any, Any] = {}
        self.project = None  # the Project this module was linted in (cross-file summaries), if any
        self.released = False  # set by release(): its scopes are gone, a cached reference must not use it
        self._collect()
        self.scope = self.scopes[tree]

    def release(self) -> None:
        """Break this model's reference cycles (model <-> scope <-> site) so its memory is returned at
        once by reference counting, not by a pass of the cyclic collector.  Only for a model that is
        never used again (one the project dropped, after the file that needed it is linted)."""
        for scope in self.scopes.values():
            scope.__dict__.clear()
        self.scopes = {}
        self._cache.clear()
        self.project = None
        self.released = True

    def project_collectives(self, func: ast.expr, scope: Scope) -> list:
        """Collectives run by a function of another project file that ``func`` names (empty alone)."""
        if self.project is None:
            return []
        return self.project.collectives_of_call(self, func, scope)
