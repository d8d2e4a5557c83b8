"""A report that cannot go where asked never costs the diagnosis: refused before any rank starts when the
destination cannot be written (read-only mount, a directory, a file as the parent), and when writing fails
at the end (full disk, a mount made read-only meanwhile) the diagnosis is printed, one line says where the
report could not go and where it went instead, no partial file is left, and the job's exit code is kept."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import psutil
import pytest

from conftest import SCRIPTS, env, poll, ranks_of, remount_ro, start_run

pytestmark = pytest.mark.scenario  # real multi-rank jobs: the full tier (make test), not test-fast

SCRIPT = str(SCRIPTS / "exit_3_after_go.py")


def _run(tmp_path, args, cwd=None, **extra):
    mark = tmp_path / "marks"
    mark.mkdir(exist_ok=True)
    r = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--no-lint", *args, "--nproc-per-node", "2",
                        SCRIPT], env=env(MARK_DIR=str(mark), **extra), cwd=cwd or tmp_path, capture_output=True,
                       text=True, timeout=120)
    return r, sorted(p.name for p in mark.iterdir())


def _lines(text):
    return [x for x in text.splitlines() if x.strip()]


def test_unwritable_destinations_are_refused_before_any_rank_starts(tmp_path, tmpfs):
    ro = tmpfs("ro,size=64k")
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    for args, why in ((["--report", str(ro / "r.json")], "Read-only file system"),
                      (["--html", str(ro / "r.html")], "Read-only file system"),
                      (["--report", str(tmp_path)], "is a directory"),
                      (["--report", str(a_file / "r.json")], "is not a directory")):
        r, started = _run(tmp_path, args)
        assert r.returncode == 2, (args, r.returncode, r.stderr[-2000:])
        lines = _lines(r.stdout + r.stderr)
        assert len(lines) == 1 and lines[0].startswith("ddp-doctor run: cannot write --"), lines
        assert why in lines[0] and "Traceback" not in r.stderr
        assert started == [], started  # no rank ran


def _fallback(line: str) -> str:
    assert "instead" in line, line
    return line.rsplit("written to ", 1)[1].rsplit(" instead", 1)[0]


def test_full_disk_prints_the_diagnosis_falls_back_and_keeps_the_exit_code(tmp_path, tmpfs):
    full = tmpfs("size=64k", fill=True)
    r, started = _run(tmp_path, ["--report", str(full / "r.json"), "--html", str(full / "r.html")], GO_FILE="/")
    out = r.stdout + r.stderr
    assert r.returncode == 3, out[-3000:]            # the program's own sys.exit(3)
    assert started == ["started-0", "started-1"]
    assert "Traceback" not in out
    assert "CRASH" in out and "DDP204" in out        # the whole diagnosis, on the terminal
    notes = [x for x in _lines(r.stderr) if x.startswith("ddp-doctor: could not write")]
    assert len(notes) == 2, notes
    assert f"the report to {full / 'r.json'} (No space left on device)" in notes[0]
    assert f"the HTML report to {full / 'r.html'} (No space left on device)" in notes[1]
    rep = json.loads(open(_fallback(notes[0])).read())
    assert rep["exit_code"] == 3 and rep["verdict"] == "crash"
    assert os.path.dirname(_fallback(notes[0])) == str(tmp_path)  # the run directory
    assert "<html" in open(_fallback(notes[1])).read()
    assert sorted(os.listdir(full)) == ["filler"]    # no r.json.tmp, no half report


def test_destination_made_read_only_during_the_run(tmp_path, tmpfs, cleanup):
    dest = tmpfs("size=1m")
    go = tmp_path / "go"
    mark = tmp_path / "marks"
    mark.mkdir()
    run = start_run(["--no-lint", "--report", str(dest / "r.json"), "--nproc-per-node", "2", SCRIPT],
                    env=env(MARK_DIR=str(mark), GO_FILE=str(go)), cwd=tmp_path)
    cleanup.append(psutil.Process(run.pid))
    assert poll(lambda: len(os.listdir(mark)) == 2, 90), run.poll()
    cleanup.extend(ranks_of(run.pid))
    remount_ro(dest)  # the pre-check passed; now the destination cannot be written
    go.write_text("go")
    out = run.communicate(timeout=120)[0]
    assert run.returncode == 3, out[-3000:]
    assert "Traceback" not in out and "DDP204" in out
    note = [x for x in _lines(out) if x.startswith("ddp-doctor: could not write the report")]
    assert len(note) == 1 and "Read-only file system" in note[0], out[-2000:]
    assert json.loads(open(_fallback(note[0])).read())["exit_code"] == 3
    assert os.listdir(dest) == []
