import json

import report_samples as S
from ddp_doctor.cli import main


def test_report_text_and_html(tmp_path, capsys):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(S.get("hang")))
    html = tmp_path / "out" / "r.html"
    assert main(["report", str(p), "--html", str(html)]) == 0
    out = capsys.readouterr().out
    assert "HANG" in out and "DDP202" in out and f"HTML report: {html}" in out
    assert html.exists() and 'data-code="DDP202"' in html.read_text()


def test_report_json_roundtrip(tmp_path, capsys):
    p = tmp_path / "r.json"
    p.write_text(json.dumps(S.get("desync")))
    assert main(["report", str(p), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["verdict"] == "desync"


def test_lint_json_accepted(tmp_path, capsys):
    p = tmp_path / "l.json"
    p.write_text(json.dumps({"schema": "ddp-doctor/lint/v1", "errors": [], "findings": [
        {"code": "DDP303", "name": "save-on-every-rank", "severity": "warning", "path": "t.py", "line": 3, "column": 1,
         "end_line": None, "end_column": None, "message": "m", "fix": "f"}]}))
    assert main(["report", str(p)]) == 0
    assert "DDP303" in capsys.readouterr().out


def test_bad_files_exit_2(tmp_path, capsys):
    missing = tmp_path / "missing.json"
    assert main(["report", str(missing)]) == 2
    assert "cannot read" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["report", str(bad)]) == 2
    assert "is not JSON" in capsys.readouterr().err
    r = S.get("hang")
    del r["ranks"][0]["stack"]
    r["verdict"] = "maybe"
    bad.write_text(json.dumps(r))
    assert main(["report", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "not a ddp-doctor report" in err and "verdict" in err and "stack" in err
    bad.write_text("[1, 2]")
    assert main(["report", str(bad)]) == 2
