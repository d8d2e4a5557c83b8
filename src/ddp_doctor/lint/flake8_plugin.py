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
        from ddp_doctor.lint.engine import lint_source

        if self.lines is not None:
            source = "".join(self.lines)
        else:
            try:
                with open(self.filename, encoding="utf-8") as fh:
                    source = fh.read()
            except (OSError, UnicodeDecodeError):
                return
        res = lint_source(source, self.filename, noqa=False)
        for f in res.findings:
            loc = f.location
            yield loc.line, (loc.column or 1) - 1, f"{f.code} {f.message} Fix: {f.fix}", type(self)
