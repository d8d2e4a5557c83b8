"""The seed write-ups' pitfalls (../shared/seeds), rewritten as code: broken versions report each
pitfall on its line, fixed versions report nothing."""
from pathlib import Path

import pytest

from ddp_doctor.lint import lint_paths

from .conftest import FIXTURES, expected_all

SEEDS = FIXTURES / "seeds"
BROKEN = sorted(SEEDS.glob("seed_*_broken.py"))


def test_there_is_a_broken_and_a_fixed_version_of_every_seed():
    assert len(BROKEN) == 5
    for b in BROKEN:
        assert (SEEDS / b.name.replace("_broken", "_fixed")).exists()


@pytest.mark.parametrize("path", BROKEN, ids=lambda p: p.stem)
def test_broken_seed_reports_each_pitfall(path: Path):
    res = lint_paths([path])
    assert res.errors == []
    got = {(f.code, f.location.line) for f in res.findings}
    want = expected_all(path)
    assert want, "a broken seed must mark its pitfalls"
    assert got == want, f"missing {sorted(want - got)}, unexpected {sorted(got - want)}"


@pytest.mark.parametrize("path", [Path(str(b).replace("_broken", "_fixed")) for b in BROKEN], ids=lambda p: p.stem)
def test_fixed_seed_reports_nothing(path: Path):
    res = lint_paths([path])
    assert res.errors == []
    assert [(f.code, f.location.line, f.message) for f in res.findings] == []
