"""Renderer-neutral helpers shared by the terminal and HTML renderers (no formatting here)."""
from __future__ import annotations

import os
import sysconfig
from typing import Any

from ddp_doctor.report import LINT_SCHEMA_ID

SEVERITY_ORDER = {"error": 0, "warning": 1, "info": 2}
GOOD_STATES = {"ok", "done", "finished", "completed", "exited_ok", "running", "training", "idle", "succeeded"}

_LIB_MARKERS = ("site-packages", "dist-packages", "<frozen", "<string>", os.sep + "torch" + os.sep)
_STDLIB = tuple(p for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")} if p)


def normalize(report: dict[str, Any]) -> dict[str, Any]:
    """Turn a lint/v1 document into a report-shaped dict; pass report/v1 through unchanged."""
    if report.get("schema") != LINT_SCHEMA_ID:
        if not report.get("ranks") and not report.get("world_size") and report.get("verdict") in (None, "ok") \
                and all(f.get("source") == "lint" for f in report.get("findings") or []):
            return dict(report, verdict=None)  # a lint-only report: no job ran
        return report
    findings = []
    for f in report.get("findings") or []:
        path = f.get("path")
        findings.append({
            "code": f.get("code", "DDP000"), "name": f.get("name", ""), "severity": f.get("severity", "info"),
            "title": f.get("title") or _catalogue_title(f.get("code")), "message": f.get("message", ""),
            "ranks": [], "evidence": {}, "fix": f.get("fix", ""), "source": "lint",
            "location": {"path": path, "line": f.get("line"), "function": None} if path else None,
        })
    return {"schema": LINT_SCHEMA_ID, "verdict": None, "exit_code": 1 if findings else 0, "world_size": 0,
            "findings": findings, "ranks": [], "errors": report.get("errors") or []}


def _catalogue_title(code: Any) -> str:
    try:
        from ddp_doctor.findings import info
        return info(str(code)).title
    except KeyError:
        return ""


def _loc_key(f: dict[str, Any]) -> tuple:
    loc = f.get("location") or {}
    return (f.get("code"), os.path.basename(str(loc.get("path") or "")), loc.get("line"))


def split_findings(report: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(runtime findings, lint-only findings), each sorted by severity.

    A lint finding the runtime also raised (same code, file and line) is shown once,
    as the runtime finding.  For a report with no runtime findings and no ranks
    (a lint-only report) everything is in the second list.
    """
    runtime, lint = [], []
    for f in report.get("findings") or []:
        (lint if f.get("source") == "lint" else runtime).append(f)
    extra = (report.get("lint") or {}).get("findings") if isinstance(report.get("lint"), dict) else None
    seen = {_loc_key(f) for f in runtime} | {_loc_key(f) for f in lint}
    for f in extra or []:
        if _loc_key(f) not in seen:
            seen.add(_loc_key(f))
            lint.append(f)
    key = lambda f: (SEVERITY_ORDER.get(f.get("severity"), 3), str(f.get("code")))  # noqa: E731
    return sorted(runtime, key=key), sorted(lint, key=key)


def lint_confirmed(report: dict[str, Any]) -> set[tuple]:
    """Keys of runtime findings that lint had also flagged (same code, file, line)."""
    runtime = [f for f in report.get("findings") or [] if f.get("source") != "lint"]
    lint = [f for f in report.get("findings") or [] if f.get("source") == "lint"]
    if isinstance(report.get("lint"), dict):
        lint += report["lint"].get("findings") or []
    lk = {_loc_key(f) for f in lint}
    return {_loc_key(f) for f in runtime if _loc_key(f) in lk}


def finding_key(f: dict[str, Any]) -> tuple:
    return _loc_key(f)


def is_library_frame(path: str | None) -> bool:
    if not path:
        return True
    p = str(path)
    if any(m in p for m in _LIB_MARKERS):
        return True
    if _STDLIB and p.startswith(_STDLIB):
        return True
    norm = p.replace("\\", "/")
    if "/ddp_doctor/" in norm and "/ddp_doctor/demo/" not in norm:
        return True
    return False


def user_frame(stack: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The innermost frame of user code (stack is outermost first, as in a traceback)."""
    if not stack:
        return None
    for fr in reversed(stack):
        if isinstance(fr, dict) and not is_library_frame(fr.get("path")):
            return fr
    last = stack[-1]
    return last if isinstance(last, dict) else None


def frame_text(fr: dict[str, Any] | None, short: bool = True) -> str:
    if not fr:
        return ""
    path = str(fr.get("path") or "?")
    if short:
        path = os.path.basename(path) or path
    line = fr.get("line")
    func = fr.get("function")
    s = f"{path}:{line}" if line is not None else path
    return f"{s} in {func}" if func else s


def collective_text(c: Any) -> str:
    """Compact text of a rank's last_collective (any dict shape)."""
    if not c:
        return ""
    if not isinstance(c, dict):
        return str(c)
    op = c.get("op") or c.get("name") or c.get("kind") or "collective"
    parts = [str(op)]
    seq = c.get("seq", c.get("seq_no", c.get("sequence")))
    if seq is not None:
        parts.append(f"#{seq}")
    extra = []
    for k in ("shape", "dtype", "group", "state"):
        if c.get(k) is not None:
            v = c[k]
            extra.append(f"{k}={'x'.join(map(str, v)) if k == 'shape' and isinstance(v, (list, tuple)) else v}")
    if c.get("done") is False or c.get("in_progress"):
        extra.append("waiting")
    s = " ".join(parts)
    return s + (f" ({', '.join(extra)})" if extra else "")


def rank_is_bad(r: dict[str, Any]) -> bool:
    state = str(r.get("state") or "").lower()
    if r.get("signal") or (r.get("exit_code") not in (None, 0)):
        return True
    return bool(state) and state not in GOOD_STATES


def exit_text(r: dict[str, Any]) -> str:
    parts = []
    if r.get("exit_code") is not None:
        parts.append(f"exit {r['exit_code']}")
    if r.get("signal"):
        parts.append(str(r["signal"]))
    return ", ".join(parts)


def evidence_items(ev: Any, limit: int = 12, width: int = 120) -> list[tuple[str, str]]:
    """Flatten evidence into short (key, value) pairs for display."""
    if not isinstance(ev, dict):
        return [("evidence", _short(ev, width))] if ev else []
    out = []
    for k, v in list(ev.items())[:limit]:
        out.append((str(k), _short(v, width)))
    if len(ev) > limit:
        out.append(("…", f"{len(ev) - limit} more"))
    return out


def _short(v: Any, width: int) -> str:
    import json
    if isinstance(v, str):
        s = v
    else:
        try:
            s = json.dumps(v, default=str, ensure_ascii=False)
        except (TypeError, ValueError):
            s = str(v)
    s = " ".join(s.split())
    return s if len(s) <= width else s[: width - 1] + "…"


def snippet_of(f: dict[str, Any], context: int = 2) -> dict[str, Any] | None:
    loc = f.get("location")
    if not isinstance(loc, dict):
        return None
    snip = loc.get("snippet")
    if isinstance(snip, dict) and snip.get("lines"):
        return snip
    from ddp_doctor.report.snippets import read_snippet
    return read_snippet(loc.get("path") or "", loc.get("line") or 0, context)


def fmt_duration(s: Any) -> str:
    try:
        s = float(s)
    except (TypeError, ValueError):
        return ""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"
