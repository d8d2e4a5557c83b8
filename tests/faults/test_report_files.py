"""The one report writer (``report.files``) on real file systems: a full tmpfs, a read-only one."""
from __future__ import annotations

import json
import os
import types

from ddp_doctor.report import files
from ddp_doctor.session import assemble


def _report(exit_code=3):
    return {"schema": "ddp-doctor/report/v1", "verdict": "crash", "exit_code": exit_code, "world_size": 2,
            "findings": [{"code": "DDP204", "name": "rank-exited", "severity": "error", "title": "a rank exited",
                          "message": "rank 1 exited with code 3", "ranks": [1], "location": None, "evidence": {},
                          "fix": "f"}], "ranks": []}


def test_unwritable_names_the_reason(tmp_path, tmpfs):
    ro = tmpfs("ro,size=64k")
    assert "Read-only file system" in files.unwritable(ro / "r.json")
    assert files.unwritable(tmp_path) == "it is a directory"
    (tmp_path / "f").write_text("x")
    assert "is not a directory" in files.unwritable(tmp_path / "f" / "r.json")
    assert files.unwritable(tmp_path / "new" / "dir" / "r.json") is None  # made when written
    assert files.unwritable(tmpfs("size=64k", fill=True) / "r.json") is None  # space is judged at the end
    assert [p for p in os.listdir(tmp_path) if p.endswith(".probe")] == []


def test_a_failed_write_leaves_no_partial_file_and_falls_back(tmp_path, tmpfs, monkeypatch):
    full = tmpfs("size=64k", fill=True)
    monkeypatch.chdir(tmp_path)
    big = "x" * 200_000  # more than is left: the write itself fails half way
    saved = files.save(full / "r.json", lambda: big)
    assert not saved.ok and saved.error == "No space left on device"
    assert os.listdir(full) == ["filler"]  # no r.json.tmp
    assert saved.path == str(tmp_path / f"ddp-doctor-{os.getpid()}-r.json")
    assert open(saved.path).read() == big
    assert saved.notice() == (f"ddp-doctor: could not write the report to {full / 'r.json'} (No space left on "
                              f"device); written to {saved.path} instead")


def test_nowhere_to_write_still_prints_the_diagnosis(tmp_path, tmpfs, monkeypatch, capsys):
    """emit() with --quiet: the report goes nowhere (full disk, read-only fallback), so the diagnosis is
    printed anyway, one line says so, and the exit code is the job's."""
    full = tmpfs("size=64k", fill=True)
    ro = tmpfs("ro,size=64k")
    monkeypatch.setattr(files, "fallback_dirs", lambda: [str(full), str(ro)])
    job = types.SimpleNamespace(store=None, own={"--report": str(full / "r.json"), "--html": str(ro / "r.html"),
                                                 "--quiet": True})
    assert assemble.emit(job, _report(), is_host=True) == 3
    err = capsys.readouterr().err
    assert "CRASH" in err and "rank 1 exited with code 3" in err and "Traceback" not in err
    notes = [x for x in err.splitlines() if x.startswith("ddp-doctor: could not write")]
    assert len(notes) == 2 and all("no fallback could be written either" in n for n in notes), notes
    assert "(No space left on device)" in notes[0] and "(Read-only file system)" in notes[1]
    assert os.listdir(full) == ["filler"] and os.listdir(ro) == []


def test_report_command_checks_its_outputs_first(tmp_path, tmpfs, capsys):
    from ddp_doctor.cli import main

    src = tmp_path / "r.json"
    src.write_text(json.dumps(_report(0)))
    ro = tmpfs("ro,size=64k")
    assert main(["report", str(src), "--html", str(ro / "r.html")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddp-doctor report: cannot write --html") and "Read-only" in err[0]
    assert main(["report", str(src), "-o", str(ro / "o.json")]) == 2
    assert main(["attach", "--report", str(ro / "a.json")]) == 2
    assert capsys.readouterr().err.count("cannot write --") == 2


def test_check_refuses_before_any_rank_starts(tmpfs, capsys):
    from ddp_doctor.cli import main

    ro = tmpfs("ro,size=64k")
    assert main(["check", "--report", str(ro / "c.json"), "--nproc-per-node", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("ddp-doctor check: cannot write --report"), err
