"""Any terminal (issue 39): ``COLUMNS`` / ``LINES`` of 0, 1, negative or garbage, no TTY, a TTY of size 0x0
(CI runners, tmux), ``TERM=dumb``, ``NO_COLOR``: ``report``, ``lint`` and ``run`` always print the diagnosis, in a
readable width (``terminal.console_size`` decides it, once).  ``COLUMNS=0`` used to make ``report`` print nothing
(exit 0) and ``run`` exit 1 with no diagnosis."""
from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import env as run_env
from ddp_doctor.cli import main

HERE = Path(__file__).resolve().parent
REPORT = HERE.parents[1] / "tests" / "report" / "data" / "run_rank0_barrier.json"
SCENARIO = HERE.parents[1] / "tests" / "scenarios" / "rank0_barrier.py"
ODD = ["0", "1", "-3", "abc", "", " 7x", "30", "100000"]


def _widest(text: str) -> int:
    return max((len(ln) for ln in text.splitlines()), default=0)


@pytest.fixture
def terminal(monkeypatch):
    def set_(columns: str | None, lines: str | None = None, **more: str) -> None:
        for name, v in (("COLUMNS", columns), ("LINES", lines)):
            if v is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, v)
        for k, v in more.items():
            monkeypatch.setenv(k, v)
    return set_


@pytest.mark.parametrize("columns", ODD + [None])
def test_report_prints_the_diagnosis_in_a_readable_width(columns, terminal, capsys):
    terminal(columns, columns)
    assert main(["report", str(REPORT)]) == 0
    out = capsys.readouterr().out
    assert "HANG" in out and "DDP201" in out and "Collective reached by only some ranks" in out
    assert 40 <= _widest(out) <= 1000


@pytest.mark.parametrize("extra", [{"TERM": "dumb"}, {"NO_COLOR": "1"}, {"TERM": "dumb", "NO_COLOR": "1"}],
                         ids=["dumb", "no_color", "both"])
def test_report_on_dumb_or_colourless_terminals(extra, terminal, capsys):
    terminal("0", "0", **extra)
    assert main(["report", str(REPORT), "--color", "auto"]) == 0
    out = capsys.readouterr().out
    assert "DDP201" in out and "\x1b[" not in out and 40 <= _widest(out) <= 100


@pytest.mark.parametrize("columns", ODD + [None])
def test_lint_prints_its_findings_whatever_the_columns(columns, terminal, capsys):
    terminal(columns, columns, TERM="dumb")
    assert main(["lint", "--no-config", str(SCENARIO)]) == 1
    out = capsys.readouterr().out
    assert "rank0_barrier.py:29" in out and "DDP201" in out


def test_a_terminal_of_size_zero_is_drawn_at_the_default_width():
    """A real TTY that reports 0x0 (a fresh pty, as under some CI runners and tmux panes), COLUMNS=0 too."""
    leader, follower = pty.openpty()  # (a new pty's size is 0 rows x 0 columns)
    e = run_env(COLUMNS="0", LINES="0", TERM="xterm-256color")
    e.pop("NO_COLOR", None)
    p = subprocess.Popen([sys.executable, "-m", "ddp_doctor", "report", str(REPORT)], stdout=follower,
                         stderr=follower, stdin=subprocess.DEVNULL, env=e)
    os.close(follower)
    chunks = []
    while True:
        try:
            b = os.read(leader, 65536)
        except OSError:  # EIO: the child closed its side
            break
        if not b:
            break
        chunks.append(b)
    os.close(leader)
    assert p.wait(60) == 0
    out = b"".join(chunks).decode("utf-8", "replace")
    plain = __import__("re").sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out)
    assert "DDP201" in plain and "Collective reached by only some ranks" in plain
    assert 40 <= _widest(plain.replace("\r", "")) <= 100


@pytest.mark.scenario
def test_run_prints_its_diagnosis_with_columns_zero(tmp_path):
    """One real 2-rank job (rank 0 alone in a barrier: stopped in seconds) under COLUMNS=0 LINES=0, no TTY."""
    report = tmp_path / "r.json"
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--no-lint", "--report", str(report),
                        "--nproc-per-node", "2", str(SCENARIO)], env=run_env(COLUMNS="0", LINES="0", TERM="dumb"),
                       capture_output=True, text=True, timeout=240)
    out = p.stdout + p.stderr
    assert p.returncode == 1, out[-3000:]
    assert "HANG: the job stopped making progress" in out and "DDP201" in out, out[-3000:]
    assert json.loads(report.read_text())["verdict"] == "hang"
    ours = [ln for ln in out.splitlines() if not ln.startswith(("W1", "[W", "frame #"))]  # (torch's own lines)
    assert 40 <= _widest("\n".join(ours)) <= 100
