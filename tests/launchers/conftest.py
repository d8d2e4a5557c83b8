from __future__ import annotations

import pytest
from launch_helpers import Procs


@pytest.fixture
def procs(tmp_path):
    ps = Procs(tmp_path)
    yield ps
    ps.kill()
