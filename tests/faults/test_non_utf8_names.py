"""Bytes that are not text (issue 39): a script whose file name is not valid UTF-8 (``train_\\xff.py``).  The
diagnosis was right, but the JSON report held lone surrogates (``\\udcff``) that strict JSON parsers refuse, and
the HTML showed ``?``.  Every report leaves through ``utf8.strict``: strict UTF-8 JSON, the name spelled
``train_\\xff.py`` (JSON, HTML, terminal), its exact bytes kept as ``path_b64``."""
from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import env as run_env
from ddp_doctor.cli import main
from ddp_doctor.utf8 import raw_bytes, readable, strict

SCENARIO = Path(__file__).resolve().parents[1] / "scenarios" / "rank0_barrier.py"
NAME = b"train_\xff.py"
SHOWN = "train_\\xff.py"


def _strings(obj):
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            yield o
        elif isinstance(o, dict):
            yield from (k for k in o if isinstance(k, str))
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)


def _strict_json(raw: bytes):
    """Parse as a strict (I-JSON) parser would: UTF-8 bytes, and no string holding a lone surrogate."""
    data = json.loads(raw.decode("utf-8"))  # (strict decoding: raises on any invalid byte)
    for s in _strings(data):
        s.encode("utf-8")  # raises UnicodeEncodeError on a lone surrogate, however it was written
    return data


def test_readable_and_strict():
    name = os.fsdecode(b"/x/" + NAME)
    assert readable(name) == "/x/" + SHOWN and readable("ok é") == "ok é" and readable("\ud83d!") == "\\ud83d!"
    assert raw_bytes(name) == b"/x/" + NAME
    doc = {"location": {"path": name, "line": 3}, "sources": {name: "x"}, "message": f"at {name}"}
    out = strict(doc)
    assert out["location"] == {"path": "/x/" + SHOWN, "path_b64": base64.b64encode(b"/x/" + NAME).decode(), "line": 3}
    assert list(out["sources"]) == ["/x/" + SHOWN] and out["message"] == f"at /x/{SHOWN}"
    assert "message_b64" in out and list(out)[:2] == ["location", "sources"]
    _strict_json(json.dumps(out).encode())
    assert strict({"a": ["b"]}) == {"a": ["b"]}
    assert "path_b64" not in strict(doc, keep_bytes=False)["location"]


def test_lint_of_a_file_named_in_bytes(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    shutil.copy(SCENARIO, os.fsdecode(NAME))
    assert main(["lint", "--no-config", "--format", "json", os.fsdecode(NAME)]) == 1
    data = _strict_json(capsys.readouterr().out.encode("utf-8"))
    (f,) = [f for f in data["findings"] if f["code"] == "DDP201"]
    assert f["path"] == SHOWN and base64.b64decode(f["path_b64"]) == NAME
    assert main(["lint", "--no-config", os.fsdecode(NAME)]) == 1
    assert f"{SHOWN}:29" in capsys.readouterr().out


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """One real 2-rank job of a failing script (rank 0 alone in a barrier) copied to a non-UTF-8 name."""
    d = tmp_path_factory.mktemp("bytes")
    shutil.copy(SCENARIO, os.path.join(os.fsencode(d), NAME))
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--no-lint", "--report", "r.json", "--html",
                        "r.html", "--nproc-per-node", "2", NAME], cwd=d, env=run_env(), capture_output=True,
                       timeout=240)
    return p, d


@pytest.mark.scenario
def test_the_json_report_is_strict_utf8_and_keeps_the_bytes(job):
    p, d = job
    assert p.returncode == 1, p.stdout[-3000:] + p.stderr[-3000:]
    raw = (d / "r.json").read_bytes()
    data = _strict_json(raw)
    assert b"\\ud" not in raw.lower()  # no surrogate escape at all
    (f,) = [f for f in data["findings"] if f["code"] == "DDP201"]
    assert data["verdict"] == "hang" and f["location"]["path"].endswith("/" + SHOWN)
    path = base64.b64decode(f["location"]["path_b64"])
    assert path.endswith(b"/" + NAME) and os.path.isfile(path)
    assert SHOWN + ":26" in f["message"]
    frames = [fr for r in data["ranks"] for fr in r.get("stack") or []]
    assert any(fr["path"].endswith("/" + SHOWN) for fr in frames), frames
    assert not [s for s in _strings(data) if "train_?" in s or "train_\ufffd" in s]


@pytest.mark.scenario
def test_html_and_terminal_show_the_name_readably(job):
    p, d = job
    html = (d / "r.html").read_bytes().decode("utf-8")
    assert SHOWN in html and "train_?" not in html and "\\udcff" not in html
    out = (p.stdout + p.stderr).decode("utf-8")
    assert "HANG" in out and f"{SHOWN}:29" in out and "train_?" not in out and "\\udcff" not in out


def test_faulthandler_frames_name_the_file_as_python_does(tmp_path):
    """A rank's faulthandler dump (a fatal signal, a rank that does not answer) escapes every character past
    ASCII; its frames are read back as the same str Python holds (so they meet the sources and snippets)."""
    from ddp_doctor.watcher.stacks import parse_faulthandler

    name = os.path.join(os.fsencode(tmp_path), "tr\u00e9_".encode() + NAME)
    with open(name, "w") as f:
        f.write("import faulthandler, sys\ndef f():\n    faulthandler.dump_traceback(sys.stdout)\nf()\n")
    out = subprocess.run([sys.executable, name], capture_output=True, timeout=60).stdout.decode("ascii")
    assert "\\xe9" in out  # (what faulthandler writes)
    frames = parse_faulthandler(out)
    assert [(fr.path, fr.line) for fr in frames] == [(os.fsdecode(name), 4), (os.fsdecode(name), 3)]
