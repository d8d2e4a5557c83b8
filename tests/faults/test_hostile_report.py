"""`ddp-doctor report` on a hostile file: it never quotes a file the job did not run, never lets a terminal
control sequence through, and answers deep or odd input with one clear line (no traceback)."""
from __future__ import annotations

import json
import subprocess
import sys

from conftest import env


def _report(findings, **extra):
    return {"schema": "ddp-doctor/report/v1", "verdict": "crash", "exit_code": 1, "world_size": 2,
            "findings": findings, "ranks": [], **extra}


def _finding(message="m", path="/etc/passwd", line=1, evidence=None):
    return {"code": "DDP204", "name": "rank-exited", "severity": "error", "title": "t", "message": message,
            "ranks": [0], "location": {"path": path, "line": line, "function": "f"}, "evidence": evidence or {},
            "fix": "f"}


def _show(tmp_path, doc, *args):
    p = tmp_path / "hostile.json"
    p.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return subprocess.run([sys.executable, "-m", "ddp_doctor", "report", str(p), *args], env=env(),
                          capture_output=True, text=True, timeout=120)


def test_a_path_written_in_a_report_is_never_read(tmp_path):
    first = open("/etc/passwd").readline().strip()
    for doc in (_report([_finding()]), _report([_finding()], sources=["/etc/passwd"])):
        for fmt in ("text", "json"):
            r = _show(tmp_path, doc, "--format", fmt, "--color", "never", "--html", str(tmp_path / "r.html"))
            assert r.returncode == 0, r.stderr
            assert first not in r.stdout and first not in (tmp_path / "r.html").read_text()


def test_terminal_control_sequences_are_stripped(tmp_path):
    evil = "\x1b]0;pwned-title\x07\x1b[2J\x1b[31mred\x1b[0m \x9b1mcsi1\x07bell\x1bPdcs\x1b\\ ok\ttab"
    doc = _report([_finding(message=evil, path=evil)], command=[evil], ranks=[
        {"rank": 0, "state": evil, "epoch": None, "step": None, "last_collective": None,
         "stack": [{"path": evil, "line": 1, "function": evil}], "exit_code": 1, "signal": None}])
    for color in ("never", "always"):
        r = _show(tmp_path, doc, "--color", color)
        assert r.returncode == 0, r.stderr
        out = r.stdout
        assert "pwned-title" not in out and "\x07" not in out and "\x9b" not in out and "\x1b[2J" not in out
        assert "red" in out and "ok" in out
        if color == "never":
            assert "\x1b" not in out


def test_deep_or_odd_input_gives_one_line(tmp_path):
    deep_json = '{"schema": "ddp-doctor/report/v1", "verdict": "crash", "exit_code": 1, "world_size": 2, ' \
                '"ranks": [], "findings": [], "x": ' + "[" * 100000 + "]" * 100000 + "}"
    nested = {"a": 1}
    for _ in range(300):
        nested = {"a": nested}
    odd = _report([_finding(path="x.py", line=10**30, evidence={"e": nested})])
    medium = _report([_finding(evidence=nested)])
    for doc in (deep_json, odd, medium, "[" * 5000 + "]" * 5000):
        r = _show(tmp_path, doc)
        assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-500:])
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and lines[0].startswith("ddp-doctor report:"), r.stderr[-2000:]
        assert "Traceback" not in r.stderr and "RecursionError" not in r.stderr


def test_wrong_types_are_refused_in_one_line_without_jsonschema(tmp_path):
    """A plain install (no jsonschema) refuses a report whose fields have the wrong types: exit 2, one line
    naming the file and the first problem; never "renderer failed" with exit 0."""
    rank = {"rank": 0, "state": "crashed", "epoch": None, "step": 1, "last_collective": None, "stack": [],
            "exit_code": 1, "signal": None}
    cases = {
        "findings": _report("not a list"),
        "findings/0/ranks": _report([dict(_finding(), ranks="0")]),
        "findings/0/location": _report([dict(_finding(), location=7)]),
        "ranks/0/timeline": _report([], ranks=[dict(rank, timeline="x")]),
        "ranks/0/stack/0": _report([], ranks=[dict(rank, stack=["x"])]),
        "exit_code": dict(_report([]), exit_code="1"),
        "lint/findings": _report([], lint={"path": "t.py", "findings": {}}),
    }
    p = tmp_path / "typed.json"
    for where, doc in cases.items():
        p.write_text(json.dumps(doc))
        code = ("import sys; sys.modules['jsonschema'] = None; from ddp_doctor.cli import main; "
                f"sys.exit(main(['report', {str(p)!r}, '--color', 'never']))")
        r = subprocess.run([sys.executable, "-c", code], env=env(), capture_output=True, text=True, timeout=120)
        lines = [x for x in r.stderr.splitlines() if x.strip()]
        assert r.returncode == 2 and r.stdout == "", (where, r.returncode, r.stdout[-300:], r.stderr[-500:])
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"ddp-doctor report: {p} is not a ddp-doctor report: {where}: "), lines[0]


def test_a_long_message_renders_in_linear_time_cut_for_display(tmp_path):
    """Rendering a 16 MB message was quadratic (> 120 s); now the screen and the page show its first
    characters and say how many are left out, and the saved JSON keeps them."""
    import resource

    msg = "word " * ((16 << 20) // 5)
    p = tmp_path / "long.json"
    p.write_text(json.dumps(_report([_finding(message=msg, path="x.py")])))
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = _show(tmp_path, json.loads(p.read_text()), "--color", "never", "--html", str(tmp_path / "r.html"))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert r.returncode == 0, r.stderr[-500:]
    assert cpu < 20, cpu  # was minutes
    assert "more characters in the JSON report]" in " ".join(r.stdout.split()) and len(r.stdout) < 100_000  # any width
    assert (tmp_path / "r.html").stat().st_size < 200_000
    r = _show(tmp_path, json.loads(p.read_text()), "--format", "json")
    assert json.loads(r.stdout)["findings"][0]["message"] == msg
