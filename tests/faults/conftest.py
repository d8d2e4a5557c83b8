"""Helpers for the fault tests: start `ddp-doctor run` as a real process in its own session, find its ranks."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
SCRIPTS = HERE / "scripts"


def env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(SRC), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def start_run(args: list[str], *, python_flags: tuple[str, ...] = (), **kw) -> subprocess.Popen:
    """`python -m ddp_doctor run ARGS` in a new session (its own process group), output captured."""
    cmd = [sys.executable, *python_flags, "-m", "ddp_doctor", "run", *args]
    return subprocess.Popen(cmd, env=kw.pop("env", None) or env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def ranks_of(launcher_pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(launcher_pid).children()  # the ranks (their loader workers are their children)
    except psutil.Error:
        return []
    out = []
    for k in kids:
        try:
            if "ddp_doctor.probe" in " ".join(k.cmdline()):
                out.append(k)
        except psutil.Error:
            pass
    return out


def poll(cond, timeout: float, every: float = 0.1):
    """Wait for cond() to be truthy; return its value (or the last falsy one at the deadline)."""
    end = time.monotonic() + timeout
    v = cond()
    while not v and time.monotonic() < end:
        time.sleep(every)
        v = cond()
    return v


@pytest.fixture
def cleanup():
    """Processes (psutil) registered here are SIGKILLed at the end of the test if still alive."""
    procs: list[psutil.Process] = []
    yield procs
    for p in procs:
        try:
            if alive(p):
                p.kill()
        except psutil.Error:
            pass
    for p in procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (OSError, psutil.Error):
            pass


class Blackhole:
    """A TCP port that accepts connections and never answers (a hung or black-holed store server)."""

    def __init__(self) -> None:
        import socket
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.fixture
def tmpfs(tmp_path):
    """mount(options) -> a fresh tmpfs directory (``ro``: read-only; ``size=64k`` then filled: a full disk).
    A condition that cannot be made fails the test (these faults are the point of it, never skipped);
    every mount is undone at the end."""
    import subprocess as sp

    mounted: list[Path] = []

    def mount(options: str = "size=64k", fill: bool = False) -> Path:
        d = tmp_path / f"mnt{len(mounted)}"
        d.mkdir()
        r = sp.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(d)], capture_output=True, text=True)
        assert r.returncode == 0, f"cannot mount a tmpfs (needs root): {r.stderr.strip()}"
        mounted.append(d)
        if fill:
            with open(d / "filler", "wb", buffering=0) as fh:
                try:
                    while True:
                        fh.write(b"\0" * 4096)
                except OSError:
                    pass
            assert os.statvfs(d).f_bavail == 0, "the tmpfs could not be filled"
        return d

    yield mount
    for d in reversed(mounted):
        sp.run(["umount", "-l", str(d)], capture_output=True)


def remount_ro(d: Path) -> None:
    import subprocess as sp

    r = sp.run(["mount", "-o", "remount,ro", str(d)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
