"""Every rule against its fixture file: flagged lines carry `# expect: DDPnnn`, the rest must stay clean."""
import re
from pathlib import Path

import pytest

from ddp_doctor.findings import CATALOGUE
from ddp_doctor.lint import RULE_CODES, lint_paths, lint_source

from .conftest import FIXTURES, expected_markers

STATIC = ["DDP101", "DDP102", "DDP103", "DDP104", "DDP105", "DDP201", "DDP202", "DDP206", "DDP301",
          "DDP302", "DDP303", "DDP401", "DDP402", "DDP403", "DDP405", "DDP406"]
RULE_FIXTURES = sorted(p for p in FIXTURES.glob("DDP*.py"))


def test_every_static_code_has_exactly_one_rule_in_the_registry():
    assert RULE_CODES == STATIC
    assert all(code in CATALOGUE for code in RULE_CODES)


def test_every_static_code_has_a_fixture_with_flagged_cases():
    for code in STATIC:
        files = [p for p in RULE_FIXTURES if p.name.startswith(code)]
        assert files, f"no fixture for {code}"
        assert any((code, ln) for p in files for (c, ln) in expected_markers(p) if c == code)


@pytest.mark.parametrize("path", RULE_FIXTURES, ids=lambda p: p.stem)
def test_fixture_reports_exactly_the_expected_lines(path: Path):
    code = re.match(r"DDP\d{3}", path.name).group(0)
    res = lint_source(path.read_text(encoding="utf-8"), str(path), select=[code])
    assert res.error is None, res.error
    got = {(f.code, f.location.line) for f in res.findings}
    want = {(c, ln) for c, ln in expected_markers(path) if c == code}
    assert got == want, f"missing {sorted(want - got)}, unexpected {sorted(got - want)}"


def test_single_process_script_reports_nothing():
    res = lint_paths([FIXTURES / "single_process.py"])
    assert res.findings == [] and res.errors == []


@pytest.mark.parametrize("path", RULE_FIXTURES, ids=lambda p: p.stem)
def test_findings_have_full_locations_and_useful_text(path: Path):
    res = lint_source(path.read_text(encoding="utf-8"), str(path))
    for f in res.findings:
        loc = f.location
        assert loc.path == str(path) and loc.line >= 1 and loc.column >= 1
        assert loc.end_line >= loc.line
        assert len(f.message) > 40 and len(f.fix) > 20
        assert f.severity == CATALOGUE[f.code].severity
