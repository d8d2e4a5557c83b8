"""A fixed sample of the trap generator (benchmarks/traps.py): correct-but-suspicious jobs composed at random
must run to verdict ok, exit 0, with no correctness warning.  The full run (>= 200 jobs) is recorded in
benchmarks/RESULTS.md; a job stopped or warned here is a bug in the mechanism, never in the pattern."""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import traps  # noqa: E402

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(1500)]
SEEDS = list(range(20))  # every mode and pattern of the generator is in this sample (checked below)
PARALLEL = int(os.environ.get("DDP_DOCTOR_TEST_PARALLEL", "2"))


def test_the_sample_covers_every_mode_and_pattern():
    seen = {p.partition(":")[0] for s in SEEDS for p in traps.generate(s).patterns}  # (outside_wait:KIND)
    want = set(traps.MODES) | set(traps.PATTERNS) | {traps.OUTSIDE}
    assert seen == want, want - seen


def test_generated_correct_jobs_are_left_alone(tmp_path):
    outcomes = traps.run_many(SEEDS, tmp_path, parallel=min(PARALLEL, 2), echo=lambda line: print(line, flush=True))
    bad = [(o.program.seed, o.program.patterns, o.verdict, o.exit_code, o.bad) for o in outcomes if o.bad]
    assert not bad, bad
