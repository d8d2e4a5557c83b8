"""Every thread's Python stack as text, without touching a frame object: ``faulthandler.dump_traceback``
into an in-memory file (~20 µs), parsed.

Why not ``sys._current_frames()``: it materializes frame objects, and a frame object held by the probe's
thread while its function returns takes over that function's locals -- then the probe's thread frees
them.  A DDP model torn down that way (its reducer destroyed outside the thread that used it) aborts
the rank ("terminate called without an active exception").  The periodic publish must never do that.
"""
from __future__ import annotations

import faulthandler
import os
import re
import tempfile
import threading

_HEAD = re.compile(rb"^(?:Current thread|Thread) 0x([0-9a-f]+) ", re.M)
_FRAME = re.compile(rb'^  File "(.*)", line (\d+) in (.*)$', re.M)


class StackDumper:
    """One per probe; used from the publisher thread only."""

    def __init__(self) -> None:
        self.fd: int | None = None
        self.lock = threading.Lock()

    def _file(self) -> int:
        if self.fd is None:
            try:
                self.fd = os.memfd_create("ddp-doctor-stacks")
            except (AttributeError, OSError):
                self.fd = os.dup(tempfile.TemporaryFile().fileno())
        return self.fd

    def dump(self) -> dict[int, bytes]:
        """{thread ident: its stack text (most recent call first)}; {} when it cannot be taken."""
        with self.lock:
            try:
                fd = self._file()
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                faulthandler.dump_traceback(fd, all_threads=True)
                size = os.lseek(fd, 0, os.SEEK_CUR)
                os.lseek(fd, 0, os.SEEK_SET)
                data = os.read(fd, size)
            except (OSError, ValueError, RuntimeError):
                return {}
        heads = list(_HEAD.finditer(data))
        out = {}
        for i, h in enumerate(heads):
            end = heads[i + 1].start() if i + 1 < len(heads) else len(data)
            out[int(h.group(1), 16)] = data[h.end():end]
        return out


def frames(text: bytes) -> list[tuple[str, int, str]]:
    """(path, line, function) of one thread's stack text, outermost first."""
    out = [(m.group(1).decode("utf-8", "replace"), int(m.group(2)), m.group(3).decode("utf-8", "replace").strip())
           for m in _FRAME.finditer(text)]
    out.reverse()
    return out


def signature(text: bytes | None) -> int:
    """A number that changes when the thread's stack (any frame, any line) changes."""
    return hash(text) & 0x7FFFFFFFFFFF if text else 0
