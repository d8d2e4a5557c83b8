"""Odd input to `ddp-doctor lint` (issue 15): only regular files are read, and at most MAX_BYTES.

Every case runs the real CLI in a subprocess with a timeout, so a regression (a read that blocks on a
FIFO or never ends on /dev/zero) fails the test instead of hanging the suite."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_doctor.lint import engine

SRC = str(Path(__file__).resolve().parents[2] / "src")
BARRIER = "import torch.distributed as dist\n\ndef f(rank):\n    if rank == 0:\n        dist.barrier()\n"
needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no mkfifo on this platform")


def lint_json(*paths, timeout=30):
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "lint", "--no-config", "--format", "json",
                        *map(str, paths)], capture_output=True, text=True, env=env, timeout=timeout,
                       stdin=subprocess.DEVNULL)
    assert "Traceback" not in p.stderr, p.stderr
    return p.returncode, json.loads(p.stdout)


def errors_by_name(data):
    return {Path(e["path"]).name: e["message"] for e in data["errors"]}


@needs_fifo
def test_a_fifo_named_on_the_command_line_is_an_error_entry_not_a_hang(tmp_path):
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)  # nobody ever writes to it: opening it for reading would block forever
    good = tmp_path / "good.py"
    good.write_text(BARRIER)
    rc, data = lint_json(fifo, good)
    assert rc == 1
    assert errors_by_name(data) == {"train.py": "not a regular file (a FIFO (named pipe)); skipped"}
    assert [f["code"] for f in data["findings"]] == ["DDP201"]  # the other file is still linted


@needs_fifo
def test_a_fifo_inside_a_walked_directory_is_reported_and_the_rest_linted(tmp_path):
    os.mkfifo(tmp_path / "pipe.py")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "good.py").write_text(BARRIER)
    rc, data = lint_json(tmp_path)
    assert rc == 1
    assert errors_by_name(data) == {"pipe.py": "not a regular file (a FIFO (named pipe)); skipped"}
    assert [Path(f["path"]).name for f in data["findings"]] == ["good.py"]


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero on this platform")
def test_dev_zero_is_an_error_entry_not_an_endless_read(tmp_path):
    rc, data = lint_json("/dev/zero", "/dev/null")
    assert rc == 1
    assert errors_by_name(data) == {"zero": "not a regular file (a character device); skipped",
                                    "null": "not a regular file (a character device); skipped"}


def test_size_cap_is_stated_in_binary_units(tmp_path):
    big = tmp_path / "big.py"
    with open(big, "wb") as fh:  # sparse: 17 MiB without writing them
        fh.truncate(17 * 2**20)
    rc, data = lint_json(big)
    assert rc == 1
    assert errors_by_name(data) == {"big.py": "file too large to lint (17.0 MiB > 16 MiB limit); skipped"}


def test_a_file_that_grows_after_the_size_check_is_still_capped(tmp_path, monkeypatch):
    path = tmp_path / "grows.py"
    path.write_text("x = 1\n" * 100)  # 600 bytes, over the (patched) 10-byte cap ...
    real = os.stat(path)
    small = os.stat_result((real.st_mode, real.st_ino, real.st_dev, real.st_nlink, real.st_uid, real.st_gid,
                            5, int(real.st_atime), int(real.st_mtime), int(real.st_ctime)))
    monkeypatch.setattr(engine.os, "stat", lambda p, *a, **k: small)  # ... but 5 bytes at the first look
    monkeypatch.setattr(engine, "MAX_BYTES", 10)
    text, err = engine.read_source(path)
    assert text is None and err == "file too large to lint (0.0 MiB > 0 MiB limit); skipped"
