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
