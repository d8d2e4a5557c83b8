"""Realistic training scripts (patterned on widely copied examples, written for these tests):
every finding must be marked `# expect: CODE` — anything else is a false positive."""
from pathlib import Path

import pytest

from ddp_doctor.lint import lint_paths

from .conftest import FIXTURES, expected_all

REALISTIC = sorted((FIXTURES / "realistic").glob("*.py"))


@pytest.mark.parametrize("path", REALISTIC, ids=lambda p: p.stem)
def test_realistic_script_reports_exactly_the_marked_lines(path: Path):
    res = lint_paths([path])
    assert res.errors == []
    got = {(f.code, f.location.line) for f in res.findings}
    want = expected_all(path)
    assert got == want, f"missing {sorted(want - got)}, unexpected {sorted(got - want)}"
