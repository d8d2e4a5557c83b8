"""The rule base class and the per-file context rules report through."""
from __future__ import annotations

import ast
from typing import Sequence

from ddp_doctor.findings import Finding, Location
from ddp_doctor.lint.model import ModuleModel
from ddp_doctor.lint.function_summary import Related


class Context:
    """One file being linted: its model, lines, and a ``report`` helper that fills locations."""

    def __init__(self, model: ModuleModel, path: str, lines: list[str]):
        self.model = model
        self.path = path
        self.lines = lines
        self.findings: list[Finding] = []
        self.fixes: list[tuple[Finding, str, ast.AST]] = []  # (finding, fix kind, node) for --fix

    def text(self, node: ast.AST, limit: int = 60) -> str:
        try:
            s = ast.unparse(node)
        except Exception:  # noqa: BLE001
            s = "..."
        s = " ".join(s.split())
        return s if len(s) <= limit else s[: limit - 3] + "..."

    def _chars(self, line: int, col_bytes: int) -> int:
        """ast columns count UTF-8 bytes; editors (and our outputs) count characters."""
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return col_bytes
        return len(text.encode("utf-8")[:col_bytes].decode("utf-8", "replace"))

    def function_name(self, node: ast.AST) -> str | None:
        fn = self.model.function_at(getattr(node, "lineno", 0))
        return None if fn is None else fn.name

    def report(self, code: str, node: ast.AST, message: str, fix: str, *, fix_kind: str | None = None,
               fix_node: ast.AST | None = None, related: Sequence[Related] = ()) -> Finding:
        """``related``: the places in other files that make this a finding (SARIF relatedLocations)."""
        end_line = getattr(node, "end_lineno", None)
        end_col = getattr(node, "end_col_offset", None)
        loc = Location(
            path=self.path,
            line=node.lineno,
            function=self.function_name(node),
            column=self._chars(node.lineno, node.col_offset) + 1,
            end_line=end_line,
            end_column=self._chars(end_line, end_col) + 1 if end_line and end_col is not None else None,
        )
        f = Finding(code, message, fix, loc)
        if related:
            f.evidence["related"] = [r.to_dict() for r in related]
        if fix_kind:
            self.fixes.append((f, fix_kind, fix_node if fix_node is not None else node))
        self.findings.append(f)
        return f


class Rule:
    """One finding code.  ``check`` yields nothing; it calls ``ctx.report``."""

    code: str = ""
    #: needs a module that uses torch.distributed / DDP / Fabric / accelerate
    needs_distributed: bool = True

    def check(self, ctx: Context) -> None:  # pragma: no cover - interface
        raise NotImplementedError
