"""``ddp-doctor lint``: static analysis of training code for distributed-training pitfalls.

Stdlib ``ast`` only — this package never imports torch (or the runtime parts of
ddp-doctor), so it runs in a lint-only CI and starts fast.

>>> from ddp_doctor.lint import lint_paths
>>> result = lint_paths(["train.py"])          # doctest: +SKIP
>>> [(f.code, f.location.line) for f in result.findings]   # doctest: +SKIP
"""
from __future__ import annotations

from ddp_doctor.lint.engine import (
    FileResult, LintError, LintResult, code_selected, discover, lint_file, lint_paths, lint_source,
)
from ddp_doctor.lint.rules import RULE_CODES, RULES

__all__ = ["lint_paths", "lint_source", "lint_file", "discover", "LintResult", "LintError", "FileResult",
           "RULES", "RULE_CODES", "code_selected"]
