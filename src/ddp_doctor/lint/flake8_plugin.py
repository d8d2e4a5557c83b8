"""flake8 plugin: ``flake8 --select DDP`` runs the ddp-doctor rules (entry point ``DDP`` in pyproject).

flake8 handles ``# noqa`` and ``--select/--ignore`` itself; this only reports.
"""
from __future__ import annotations

import ast
from typing import Iterator

from ddp_doctor import __version__


class Flake8Plugin:
    name = "ddp-doctor"
    version = __version__

    def __init__(self, tree: ast.AST, filename: str = "<stdin>", lines: list[str] | None = None):
        self.tree = tree
        self.filename = filename
        self.lines = lines

    def run(self) -> Iterator[tuple[int, int, str, type]]:
        from pathlib import Path

        from ddp_doctor.lint.engine import lint_source, read_source

        if self.lines is not None:
            source = "".join(self.lines)
        else:
            source, _err = read_source(Path(self.filename))  # regular files only, size-capped
            if source is None:
                return
        tree = self.tree if isinstance(self.tree, ast.Module) else None
        res = lint_source(source, self.filename, noqa=False, tree=tree)
        for f in res.findings:
            loc = f.location
            yield loc.line, (loc.column or 1) - 1, f"{f.code} {f.message} Fix: {f.fix}", type(self)
