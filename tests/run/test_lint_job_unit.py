"""The embedded watcher's lint (session/lint_job.py): the script is linted in a child process beside the job,
and its findings reach the report as `run`'s do; nothing runs for a script that is not a file, or when asked
not to."""
from __future__ import annotations

from pathlib import Path

from ddp_doctor.session.lint_job import LintJob

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"


def test_the_script_is_linted_in_a_child_process():
    job = LintJob(str(SCENARIOS / "rank0_barrier.py"))
    assert job.proc is not None and job.proc.pid > 0
    found = job.findings(wait_s=60)
    assert any(f.code == "DDP201" and f.location and f.location.path.endswith("rank0_barrier.py") for f in found)


def test_nothing_runs_without_a_script_file_or_when_turned_off(monkeypatch, tmp_path):
    assert LintJob(None).findings() == [] and LintJob(str(tmp_path / "gone.py")).proc is None
    monkeypatch.setenv("DDP_DOCTOR_NO_LINT", "1")
    assert LintJob(str(SCENARIOS / "rank0_barrier.py")).proc is None
