import io
import re

import jsonschema
import pytest
from rich.console import Console

import report_samples as S
from ddp_doctor.report import REPORT_JSON_SCHEMA
from ddp_doctor.report.terminal import LiveView, print_report

ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(autouse=True)
def _default_width(monkeypatch):
    """The texts below are laid out at the renderer's default width (100), whatever COLUMNS the caller's
    terminal (or pytest-xdist's worker: 80) sets."""
    monkeypatch.delenv("COLUMNS", raising=False)


class FakeTTY(io.StringIO):
    def isatty(self):
        return True


@pytest.mark.parametrize("name", list(S.ALL))
def test_samples_follow_the_contract(name):
    jsonschema.validate(S.get(name), REPORT_JSON_SCHEMA)


def render(report, **kw):
    buf = io.StringIO()
    print_report(report, file=buf, **kw)
    return buf.getvalue()


def test_hang_report_plain_has_everything():
    out = render(S.get("hang"))
    assert not ANSI.search(out), "non-TTY output must be plain"
    assert "HANG" in out and "exit code 1" in out and "world size 2" in out and "14.2 s" in out
    assert "DDP202 ddp-forward-on-subset-of-ranks" in out and "[error]" in out and "rank 0" in out
    # snippet with the flagged line marked
    assert re.search(r">\s+41 \|\s+out = model\(x\)", out)
    assert re.search(r"^\s+40 \|", out, re.M)
    assert "ddp_forwards:" in out and "fix: Evaluate model.module" in out
    assert "also seen in the source by lint: line 41" in out
    # lint finding the runtime did not raise, in its own section; the one it raised is not repeated
    assert "Seen in the source" in out and "DDP406" in out
    assert out.count("DDP202 ddp-forward") == 1
    # rank table: where each rank stopped = innermost user frame, not torch
    assert "train.py:63 in main" in out and "train.py:58 in main" in out
    assert "all_reduce #93" in out and "broadcast #81" in out
    assert "_tensor.py" not in out.split("Ranks")[-1]


def test_color_on_a_terminal_and_no_color():
    r = S.get("hang")
    colored = render(r, color=True)
    assert ANSI.search(colored)
    assert "DDP202" in ANSI.sub("", colored)
    # rich Console forced to a terminal, as a user's TTY
    buf = io.StringIO()
    con = Console(file=buf, force_terminal=True)
    print_report(r, file=con.file, color=True)
    assert ANSI.search(buf.getvalue())


def test_tty_detection_and_no_color_env(monkeypatch):
    r = S.get("desync")
    monkeypatch.delenv("NO_COLOR", raising=False)
    tty = FakeTTY()
    print_report(r, file=tty)
    assert ANSI.search(tty.getvalue()), "a TTY gets colour"
    monkeypatch.setenv("NO_COLOR", "1")
    tty = FakeTTY()
    print_report(r, file=tty)
    assert not ANSI.search(tty.getvalue()), "NO_COLOR disables colour even on a TTY"
    assert "DESYNC" in tty.getvalue() and "DDP203" in tty.getvalue()


def test_ok_perf_and_lint_only():
    out = render(S.get("ok_perf"))
    assert "OK" in out and "DDP401 data-bound" in out and "DDP404" in out and "rank 3" in out
    out = render(S.get("lint_only"))
    assert "LINT" in out and "ran clean" not in out
    assert "DDP201" in out and "DDP102" in out and "Ranks" not in out


def test_lint_v1_document_renders():
    doc = {"schema": "ddp-doctor/lint/v1", "errors": [{"path": "bad.py", "message": "syntax error"}], "findings": [
        {"code": "DDP303", "name": "save-on-every-rank", "severity": "warning", "path": "t.py", "line": 3, "column": 1,
         "end_line": None, "end_column": None, "message": "torch.save on every rank", "fix": "guard it"}]}
    out = render(doc)
    assert "DDP303" in out and "t.py:3" in out and "bad.py: syntax error" in out


def test_missing_optional_fields_do_not_crash():
    r = {"schema": "ddp-doctor/report/v1", "verdict": "crash", "exit_code": 1, "world_size": 2, "findings": [],
         "ranks": [{"rank": 1, "state": "exited", "epoch": None, "step": None, "last_collective": None, "stack": [],
                    "exit_code": -9, "signal": "SIGKILL"}]}
    out = render(r)
    assert "CRASH" in out and "SIGKILL" in out and "No specific cause" in out


def test_snippet_read_from_a_file_the_job_ran(tmp_path):
    src = tmp_path / "train.py"
    src.write_text("a = 1\nb = 2\nif rank == 0:\n    dist.barrier()\nc = 3\n")
    r = S.get("lint_only")
    r["findings"][0]["location"] = {"path": str(src), "line": 4, "function": None}
    assert not re.search(r">\s+4 \|", render(r))  # the renderer never opens a file named in a report
    from ddp_doctor.report.snippets import attach_snippets

    r["sources"] = [str(src)]  # ... only the files the job ran, attached beforehand
    out = render(attach_snippets(r))
    assert re.search(r">\s+4 \|\s+dist.barrier\(\)", out)


def test_live_view_tty_and_log():
    rows = [{"rank": 0, "state": "running", "epoch": 1, "step": 12, "steps_per_s": 3.5, "data_wait_pct": 40, "where": "t.py:3"},
            {"rank": 1, "state": "hung", "epoch": 1, "step": 9, "steps_per_s": 0.0, "data_wait_pct": None, "where": "t.py:9"}]
    tty = FakeTTY()
    with LiveView(2, file=tty, color=True) as lv:
        lv.update(rows)
    out = ANSI.sub("", tty.getvalue())
    assert "watching 2 ranks" in out and "3.5" in out and "40%" in out and "hung" in out
    log = io.StringIO()
    with LiveView(2, file=log) as lv:
        for _ in range(50):
            lv.update(rows)
    assert log.getvalue() == "", "no live spam in logs"
    log = io.StringIO()
    with LiveView(2, file=log, log_interval_s=0) as lv:
        lv.update(rows)
    assert "r0 e1 s12 3.5/s dw 40% running" in log.getvalue() and "\x1b" not in log.getvalue()
    with LiveView(2, file=io.StringIO()) as lv:
        lv.update([{"rank": "x", "steps_per_s": "nan?"}])  # garbage rows never raise


def test_restarted_attempt_is_shown_after_the_last_attempts_findings():
    rep = S.restarted_report()
    jsonschema.validate(rep, REPORT_JSON_SCHEMA)
    out = render(rep)
    assert "OK" in out.splitlines()[1] or "OK" in out
    head, _, tail = out.partition("Attempt 0 ended in CRASH; torch's agent restarted the job (the run above is attempt 1)")
    assert tail, out
    assert "DDP204 rank-exited" in tail and "rank 1" in tail and "stale file handle" in tail
    assert "DDP204" not in head


def test_a_failed_diagnosis_is_said_and_the_ranks_still_shown():
    rep = dict(S.get("hang"), findings=[], diagnosis_error="IndexError: list index out of range at exits.py:212")
    jsonschema.validate(rep, REPORT_JSON_SCHEMA)
    out = render(rep)
    assert "HANG" in out and "could not word a diagnosis" in out and "exits.py:212" in out
    assert "train.py:63 in main" in out  # every rank's state is still there
