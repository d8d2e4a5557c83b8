"""Many writers of the same files at once (issue 39): 50 ``ddp-doctor report --html`` on one report used to
collide on one temporary name beside the target ("could not write ... (No such file or directory)", readers
seeing 0-byte files).  Every file is written through ``atomic.write_atomic``: a unique temporary name in the
same directory, fsync, rename -- a reader sees the old file or a new one, whole."""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import subprocess
import sys
import threading
from pathlib import Path

from ddp_doctor.atomic import write_atomic

SRC = Path(__file__).resolve().parents[2] / "src"


def _hammer(path: str, who: int, times: int) -> None:
    for i in range(times):
        # sizes differ per writer and per write: a torn or mixed file cannot pass for a whole one
        write_atomic(path, json.dumps({"who": who, "i": i, "pad": "x" * (1000 * (who + 1) + i)}))


class _Reader(threading.Thread):
    """Reads ``paths`` as fast as it can until told to stop; ``check(text)`` says whether a read was whole."""

    def __init__(self, paths: list[Path], check) -> None:
        super().__init__(daemon=True)
        self.paths, self.check = paths, check
        self.stop, self.reads, self.bad = threading.Event(), 0, []

    def run(self) -> None:
        while not self.stop.is_set():
            for p in self.paths:
                try:
                    text = p.read_text(encoding="utf-8")
                except FileNotFoundError:
                    continue  # not written yet
                self.reads += 1
                if not self.check(text):
                    self.bad.append((p.name, len(text), text[:80]))


def _whole_json(text: str) -> bool:
    try:
        d = json.loads(text)
    except ValueError:
        return False
    return len(d["pad"]) == 1000 * (d["who"] + 1) + d["i"]


def test_concurrent_writers_never_collide_and_readers_see_whole_files(tmp_path):
    target = tmp_path / "out.json"
    reader = _Reader([target], _whole_json)
    reader.start()
    ctx = mp.get_context("fork")
    procs = [ctx.Process(target=_hammer, args=(str(target), w, 150)) for w in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    reader.stop.set()
    reader.join(10)
    assert [p.exitcode for p in procs] == [0] * 8
    assert reader.reads > 0 and reader.bad == []
    assert _whole_json(target.read_text())
    assert sorted(os.listdir(tmp_path)) == ["out.json"]  # no temporary file left behind


def test_write_atomic_keeps_an_existing_files_mode_and_gives_a_new_one_the_umasks(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("old\n")
    script.chmod(0o755)
    write_atomic(script, "new\r\n")  # (bytes as they are: a fixed file keeps its own line endings)
    assert script.read_bytes() == b"new\r\n" and script.stat().st_mode & 0o777 == 0o755
    old = os.umask(0o027)
    try:
        write_atomic(tmp_path / "new.json", b"{}")
    finally:
        os.umask(old)
    assert (tmp_path / "new.json").stat().st_mode & 0o777 == 0o640


def test_many_report_commands_writing_the_same_paths(tmp_path):
    """The user's case: ``ddp-doctor report r.json -o out.json --html out.html``, many at once, a reader polling."""
    src = tmp_path / "r.json"
    src.write_text(json.dumps({
        "schema": "ddp-doctor/report/v1", "verdict": "crash", "exit_code": 3, "world_size": 2,
        "findings": [{"code": "DDP204", "name": "rank-exited", "severity": "error", "title": "a rank exited",
                      "message": "rank 1 exited with code 3", "ranks": [1], "location": None, "evidence": {},
                      "fix": "f"}], "ranks": []}))
    out_json, out_html = tmp_path / "out" / "o.json", tmp_path / "out" / "o.html"

    def whole(text: str) -> bool:
        if text.lstrip().startswith("{"):
            try:
                return json.loads(text)["verdict"] == "crash"
            except (ValueError, KeyError):
                return False
        return text.rstrip().endswith("</html>")

    reader = _Reader([out_json, out_html], whole)
    reader.start()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p))
    cmd = [sys.executable, "-m", "ddp_doctor", "report", str(src), "-o", str(out_json), "--html", str(out_html),
           "--color", "never"]
    procs = [subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
             for _ in range(12)]
    errors = [(p.wait(120), p.stderr.read()) for p in procs]
    reader.stop.set()
    reader.join(10)
    assert [e for e in errors if e[0] != 0 or "could not write" in e[1]] == []
    assert reader.reads > 0 and reader.bad == []
    assert whole(out_json.read_text()) and whole(out_html.read_text())
    assert sorted(os.listdir(out_json.parent)) == ["o.html", "o.json"]
