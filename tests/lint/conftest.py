import re
from pathlib import Path

import pytest

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures"
EXPECT = re.compile(r"#\s*expect:\s*(DDP\d{3})")


def expected_markers(path: Path) -> set[tuple[str, int]]:
    """(code, line) pairs of the `# expect: DDPnnn` comments of a fixture."""
    out = set()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        for m in EXPECT.finditer(line):
            out.add((m.group(1), i))
    return out


@pytest.fixture
def fixtures_dir() -> Path:
    return FIXTURES


EXPECT_MULTI = re.compile(r"#\s*expect:\s*((?:DDP\d{3}\s*)+)")


def expected_all(path: Path) -> set[tuple[str, int]]:
    """Like expected_markers, but a marker may list several codes: `# expect: DDP103 DDP402`."""
    out = set()
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        m = EXPECT_MULTI.search(line)
        if m:
            for code in m.group(1).split():
                out.add((code, i))
    return out
