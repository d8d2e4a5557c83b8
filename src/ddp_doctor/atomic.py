"""Files written whole or not at all: the one writer of every file ddp-doctor produces.

Stdlib only, so the linter (which imports no runtime code) and the probe inside a rank share it with the
report writers (:mod:`ddp_doctor.report.files` adds the checks before a job and the fallbacks after it).
"""
from __future__ import annotations

import contextlib
import os
import stat
import tempfile


def write_atomic(path: str | os.PathLike[str], data: str | bytes) -> None:
    """Write ``data`` (text as UTF-8) to ``path``, its missing directories made: whole or not at all, however
    many writers race for the same path.  The one writer of every file ddp-doctor produces (reports, HTML,
    lint output and fixes, Flight Recorder dumps, evidence, demo scripts).

    A temporary file of a name no other writer can hold (``mkstemp``: ``O_EXCL`` in the same directory, so
    the rename stays on one file system) is written, flushed to disk, given the target's mode (an existing
    file keeps its own: a fixed script stays executable; a new one gets what ``open()`` would give it) and
    renamed over the target: a reader sees the old file or the new one, never a partial or empty one, and
    of several concurrent writers the last rename wins.  (One shared ``PATH.tmp`` let writers truncate,
    rename and delete each other's files: "No such file or directory", 0-byte reads.)  The temporary file
    is removed whatever fails; the OSError is the caller's."""
    p = os.fspath(path)
    parent = os.path.dirname(os.path.abspath(p))
    os.makedirs(parent, exist_ok=True)
    raw = data.encode("utf-8", "replace") if isinstance(data, str) else bytes(data)
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(p)[:100]}.", suffix=".tmp", dir=parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(raw)
            fh.flush()
            os.fchmod(fh.fileno(), _mode_for(p))
            os.fsync(fh.fileno())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _mode_for(path: str) -> int:
    """The permission bits a file written to ``path`` gets: the existing file's, else 0o666 less the umask."""
    with contextlib.suppress(OSError):
        return stat.S_IMODE(os.stat(path).st_mode)
    return 0o666 & ~_umask()


def _umask() -> int:
    """This process's umask, read without changing it (``os.umask`` sets it: a race with other threads)."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            return int(next(ln for ln in fh if ln.startswith("Umask:")).split()[1], 8)
    return 0o022
