"""Where a report goes: checked before the work starts, written whole or not at all, never lost.

The one writer of every command that writes a report (``run`` and its embedded watcher, ``attach``,
``report -o/--html``, ``check``, ``demo``).  A destination that cannot be written is refused before any
rank runs (:func:`unwritable`); a write that still fails at the end (a full disk, permissions changed
meanwhile) leaves no partial file, falls back to the working directory (then the temp directory) and
says so in one line (:meth:`Saved.notice`): the caller prints the diagnosis anyway and keeps its exit code.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from dataclasses import dataclass
from typing import Any, Callable

from ddp_doctor.atomic import write_atomic

__all__ = ["Saved", "save", "save_reports", "refuse_unwritable", "unwritable", "write_atomic", "why",
           "fallback_dirs"]


@dataclass(frozen=True)
class Saved:
    """What became of one report file."""

    what: str             # "report", "HTML report"
    requested: str        # the path the user asked for
    path: str | None      # where it is: the requested path, a fallback, or None (nowhere)
    error: str | None     # why the requested path could not be written (None: it was)

    @property
    def ok(self) -> bool:
        return self.error is None

    def notice(self) -> str | None:
        """One line for the terminal when the requested path failed (None when it did not)."""
        if self.error is None:
            return None
        where = (f"written to {self.path} instead" if self.path
                 else "no fallback could be written either: the diagnosis printed above is all there is")
        return f"ddp-doctor: could not write the {self.what} to {self.requested} ({self.error}); {where}"


def why(exc: OSError) -> str:
    """An OSError in words, without the path (the caller names it)."""
    return exc.strerror or type(exc).__name__


def unwritable(path: str | os.PathLike[str]) -> str | None:
    """Why a report cannot be written to ``path`` (None when it can): asked before a job starts, so a typo
    or a read-only directory costs one line, not the job's diagnosis.  It creates and removes a file
    beside ``path`` (permissions, read-only mounts, immutable directories all show up); free space is
    not judged here (a job's report is small, and a disk may fill meanwhile: :func:`save` handles that)."""
    p = os.path.abspath(os.fspath(path))
    if os.path.isdir(p):
        return "it is a directory"
    if os.path.lexists(p) and not os.path.isfile(p):
        return "it exists and is not a regular file"
    parent = os.path.dirname(p)
    while not os.path.lexists(parent) and os.path.dirname(parent) != parent:
        parent = os.path.dirname(parent)  # missing directories are made when writing: their first existing one counts
    if not os.path.isdir(parent):
        return f"{parent} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".ddp-doctor-", suffix=".probe", dir=parent)
    except OSError as exc:
        return f"the directory {parent} cannot be written: {why(exc)}"
    os.close(fd)
    with contextlib.suppress(OSError):
        os.unlink(probe)
    return None


def fallback_dirs() -> list[str]:
    """Where a report that could not go where asked is written instead: the working directory, then /tmp."""
    out = []
    for d in (os.getcwd, tempfile.gettempdir):
        with contextlib.suppress(OSError):
            d = os.path.abspath(d())
            if d not in out:
                out.append(d)
    return out


def save(path: str | os.PathLike[str], render: Callable[[], str], what: str = "report") -> Saved:
    """Render once and write to ``path``, else to a fallback (:func:`fallback_dirs`); never raises."""
    requested = os.fspath(path)
    try:
        text = render()
    except Exception as exc:  # a renderer bug: there is nothing to write anywhere
        return Saved(what, requested, None, f"it could not be rendered: {type(exc).__name__}: {exc}"[:300])
    try:
        write_atomic(requested, text)
        return Saved(what, requested, requested, None)
    except (OSError, ValueError) as exc:
        error = why(exc) if isinstance(exc, OSError) else f"{type(exc).__name__}: {exc}"[:200]
    name = f"ddp-doctor-{os.getpid()}-{os.path.basename(requested) or 'report'}"
    for d in fallback_dirs():
        alt = os.path.join(d, name)
        if os.path.abspath(alt) == os.path.abspath(requested):
            continue
        try:
            write_atomic(alt, text)
            return Saved(what, requested, alt, error)
        except (OSError, ValueError):
            continue
    return Saved(what, requested, None, error)


def save_reports(report: dict[str, Any], json_path: str | None, html_path: str | None) -> list[Saved]:
    """Write the JSON and the HTML report where asked (each through :func:`save`)."""
    from ddp_doctor.report import report_json

    out = []
    if json_path:
        out.append(save(json_path, lambda: report_json(report), "report"))
    if html_path:
        from ddp_doctor.report.html import render_html

        out.append(save(html_path, lambda: render_html(report), "HTML report"))
    return out


def refuse_unwritable(command: str, paths: dict[str, str | None]) -> str | None:
    """The one line that refuses a command whose report destinations (option -> path) cannot be written."""
    for opt, path in paths.items():
        if path:
            problem = unwritable(path)
            if problem:
                return f"{command}: cannot write {opt} {path}: {problem}"
    return None
