"""Attach a few source lines around each finding's line, so renderers work without the file.

``attach_snippets`` is best effort: a file that is missing, unreadable, binary or
huge simply gets no snippet; it never raises.

It quotes only files the job actually ran: the report's ``sources`` (recorded from the ranks'
sites and stacks when the report was made), never a path that is merely written in a finding —
a report handed to ``ddp-doctor report`` could name ``/etc/passwd``.  From a saved report (which
anyone could have written) only Python source files are read.
"""
from __future__ import annotations

import os
import stat
from typing import Any, Iterable

MAX_FILE_BYTES = 4 * 1024 * 1024
MAX_LINE_CHARS = 300
MAX_CONTEXT = 10


def read_snippet(path: str, line: int, context: int = 2, _cache: dict | None = None) -> dict[str, Any] | None:
    """``{"start": first_line_no, "lines": [...]}`` around 1-based ``line`` of ``path``, or None."""
    try:
        line = int(line)
        context = max(0, min(int(context), MAX_CONTEXT))
    except (TypeError, ValueError):
        return None
    if line < 1 or not path:
        return None
    lines = None if _cache is None else _cache.get(path)
    if lines is None:
        try:
            if not os.path.isfile(path) or os.path.getsize(path) > MAX_FILE_BYTES:
                return None
            with open(path, "rb") as fh:
                raw = fh.read(MAX_FILE_BYTES + 1)
            if b"\0" in raw[:8192]:
                return None
            lines = raw.decode("utf-8", errors="replace").splitlines()
        except (OSError, ValueError):
            return None
        if _cache is not None:
            _cache[path] = lines
    if line > len(lines):
        return None
    start = max(1, line - context)
    end = min(len(lines), line + context)
    out = [s.rstrip("\r\n")[:MAX_LINE_CHARS] for s in lines[start - 1:end]]
    return {"start": start, "lines": out}


def _all_findings(report: dict[str, Any]) -> Iterable[dict[str, Any]]:
    for f in report.get("findings") or []:
        yield f
    lint = report.get("lint")
    if isinstance(lint, dict):
        for f in lint.get("findings") or []:
            yield f
    for past in report.get("restarts") or []:  # attempts torch's agent restarted
        if isinstance(past, dict):
            yield from past.get("findings") or []


def stack_sources(stacks: Iterable[Iterable[dict[str, Any]]]) -> list[str]:
    """The source files of stacks taken from the job's own processes (attach's samples, Flight Recorder
    dumps): what a report built from them may list as its ``sources``."""
    return sorted({f["path"] for st in stacks for f in st
                   if isinstance(f.get("path"), str) and f["path"].startswith("/") and f["path"].endswith(".py")})


def saved_report_sources(report: dict[str, Any]) -> set[str]:
    """The files a saved report may have quoted: its ``sources`` that are Python source files."""
    out = set()
    for p in report.get("sources") or ():
        if isinstance(p, str) and _python_source(p):
            out.add(p)
    return out


def _python_source(path: str) -> bool:
    """A regular ``.py`` file (the name and the file a symlink leads to)."""
    try:
        real = os.path.realpath(path)
        return path.endswith(".py") and real.endswith(".py") and stat.S_ISREG(os.stat(real).st_mode)
    except (OSError, ValueError):
        return False


def attach_snippets(report: dict[str, Any], context: int = 2, allowed: set[str] | None = None) -> dict[str, Any]:
    """Add ``location.snippet`` to every finding (runtime and folded lint) whose file the job ran.

    ``allowed``: the files that may be read (default: :func:`saved_report_sources`).  Existing
    snippets are kept.  Returns ``report`` (modified in place).
    """
    cache: dict[str, list[str]] = {}
    if allowed is None:
        allowed = saved_report_sources(report)
    try:
        for f in _all_findings(report):
            if not isinstance(f, dict):
                continue
            loc = f.get("location")
            if not isinstance(loc, dict) or loc.get("snippet"):
                continue
            path = loc.get("path") or ""
            if path not in allowed:
                continue
            snip = read_snippet(path, loc.get("line") or 0, context, cache)
            if snip:
                loc["snippet"] = snip
    except Exception:  # never let decoration break a report
        pass
    return report
