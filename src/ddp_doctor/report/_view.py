"""Renderer-neutral helpers shared by the terminal and HTML renderers (no formatting here)."""
from __future__ import annotations

import os
from typing import Any

from ddp_doctor import frames
from ddp_doctor.evidence import Collective
from ddp_doctor.findings import severity_rank
from ddp_doctor.report import LINT_SCHEMA_ID
from ddp_doctor.report.ranks import GOOD




# a rank's timeline is drawn from its last events: 2,000 per rank, fewer when there are many ranks, so a
# page never holds more than TIMELINE_BUDGET of them (the JSON report keeps them all)
MAX_TIMELINE_EVENTS = 2000
TIMELINE_BUDGET = 200_000


def timeline_cap(lanes: int) -> int:
    """How many of its last events each of ``lanes`` ranks shows."""
    return max(50, min(MAX_TIMELINE_EVENTS, TIMELINE_BUDGET // max(1, lanes)))


def for_display(report: dict[str, Any], timelines: bool = True) -> dict[str, Any]:
    """The report as renderers show it: long strings cut (``safe.MAX_DISPLAY_CHARS``), control sequences
    gone, each rank's timeline cut to its last ``timeline_cap`` events (none unless ``timelines``: the
    terminal draws none).  A copy whose size is bounded per string and per rank, so rendering costs time
    linear in the report's size."""
    from ddp_doctor.report.safe import MAX_DISPLAY_CHARS, clean
    from ddp_doctor.utf8 import strict

    ranks = report.get("ranks")
    if isinstance(ranks, list):
        cap = timeline_cap(len(ranks)) if timelines else 0
        cut = []
        for r in ranks:
            tl = r.get("timeline") if isinstance(r, dict) else None
            cut.append(dict(r, timeline=tl[len(tl) - cap:]) if isinstance(tl, list) and len(tl) > cap else r)
        report = dict(report, ranks=cut)
    # (bytes that are not UTF-8, as \xNN: the page and the terminal show the name; the JSON keeps its bytes)
    return clean(strict(report, keep_bytes=False), max_chars=MAX_DISPLAY_CHARS)


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


def restarts(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The attempts torch's agent restarted (``--max-restarts``): [{"title", "verdict", "findings"}]."""
    out = []
    final = report.get("attempt")
    for past in report.get("restarts") or []:
        if not isinstance(past, dict):
            continue
        verdict = str(past.get("verdict") or "?").upper()
        title = f"Attempt {past.get('attempt')} ended in {verdict}; torch's agent restarted the job" + (
            f" (the run above is attempt {final})" if final is not None else "")
        out.append({"title": title, "verdict": past.get("verdict"),
                    "findings": [f for f in past.get("findings") or [] if isinstance(f, dict)]})
    return out


def _catalogue_title(code: Any) -> str:
    try:
        from ddp_doctor.findings import info
        return info(str(code)).title
    except KeyError:
        return ""


def _loc_key(f: dict[str, Any]) -> tuple:
    loc = f.get("location") or {}
    return (f.get("code"), os.path.basename(str(loc.get("path") or "")), loc.get("line"))


def _file_key(f: dict[str, Any]) -> tuple:
    loc = f.get("location") or {}
    return (f.get("code"), os.path.basename(str(loc.get("path") or "")))


def _lint_all(report: dict[str, Any]) -> list[dict[str, Any]]:
    out = [f for f in report.get("findings") or [] if isinstance(f, dict) and f.get("source") == "lint"]
    lint = report.get("lint")
    if isinstance(lint, dict):
        out += [f for f in lint.get("findings") or [] if isinstance(f, dict)]
    return out


def split_findings(report: dict[str, Any]) -> tuple[list[dict], list[dict]]:
    """(runtime findings, lint-only findings), each sorted by severity.

    A lint finding of a code the runtime raised in the same file is shown once, as
    the runtime finding (lint may point at the caller, the runtime at the call
    that ran).  For a lint-only report everything is in the second list.
    """
    runtime = [f for f in report.get("findings") or [] if isinstance(f, dict) and f.get("source") != "lint"]
    raised = {_file_key(f) for f in runtime}
    lint, seen = [], set()
    for f in _lint_all(report):
        if _file_key(f) in raised or _loc_key(f) in seen:
            continue
        seen.add(_loc_key(f))
        lint.append(f)
    key = lambda f: (-severity_rank(f.get("severity")), str(f.get("code")))  # noqa: E731
    return sorted(runtime, key=key), sorted(lint, key=key)


def lint_lines(report: dict[str, Any], f: dict[str, Any]) -> list[int]:
    """Lines where lint flagged the same code in the same file as runtime finding ``f``."""
    k = _file_key(f)
    return sorted({(g.get("location") or {}).get("line") for g in _lint_all(report)
                   if _file_key(g) == k and isinstance((g.get("location") or {}).get("line"), int)})


def nnodes(report: dict[str, Any]) -> int:
    """Node count from ``nnodes`` (an int or torchrun's "MIN:MAX" string); 1 when unknown."""
    v = report.get("nnodes")
    try:
        return int(str(v).split(":")[-1]) if v is not None else 1
    except ValueError:
        return 1


def is_library_frame(path: str | None) -> bool:
    """Not the user's code (ddp_doctor.frames decides, as for the probe and diagnosis)."""
    return not frames.is_user(path)


def stopped_at(r: dict[str, Any]) -> dict[str, Any] | None:
    """Where a rank stopped: the runner's ``where`` if given, else the innermost user frame of its stack."""
    w = r.get("where")
    uf = user_frame(r.get("stack"))
    if isinstance(w, dict) and w.get("path"):
        if is_library_frame(w.get("path")) and uf and not is_library_frame(uf.get("path")):
            return uf  # the runner's "where" fell inside a library: show the user's line
        return w
    return uf


def user_frame(stack: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The innermost frame of user code (stack is outermost first, as in a traceback)."""
    if not stack:
        return None
    fr = frames.innermost_user([f for f in stack if isinstance(f, dict)], path=lambda f: f.get("path"))
    if fr is not None:
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
    """Compact text of a rank's last collective: op, #seq, group (if not the world), shapes, dtypes, wait."""
    if not c:
        return ""
    if not isinstance(c, dict):
        return str(c)
    try:
        coll = Collective.from_json(c)
    except (KeyError, TypeError, AttributeError):
        return str(c.get("op") or "collective")
    parts = [coll.op] + ([f"#{coll.seq}"] if coll.seq is not None else [])
    extra = []
    if coll.group not in (None, "world", "default_pg"):
        extra.append(f"group={coll.group}")
    if coll.shapes:  # a group creation's arguments name themselves (ranks=[0, 1])
        extra.append(("" if "=" in coll.shapes[0] else "shapes=") + ", ".join(coll.shapes))
    if coll.dtypes:
        extra.append("dtypes=" + ", ".join(sorted(set(coll.dtypes))))
    if coll.waiting_s is not None:
        extra.append(f"waiting {coll.waiting_s:g}s")
    s = " ".join(parts)
    return s + (f" ({', '.join(extra)})" if extra else "")


def rank_is_bad(r: dict[str, Any]) -> bool:
    state = str(r.get("state") or "").lower()
    if r.get("signal") or (r.get("exit_code") not in (None, 0)):
        return True
    return bool(state) and state not in GOOD


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
    ev = {k: v for k, v in ev.items() if k != "lint"}  # the message already says lint saw it coming
    for k, v in list(ev.items())[:limit]:
        if isinstance(v, dict) and v and len(v) <= 16 and any(isinstance(x, dict) for x in v.values()):
            for k2, v2 in v.items():  # e.g. per-rank calls: one line each
                out.append((f"{k} {k2}", _short(v2, width)))
            continue
        out.append((str(k), _short(v, width)))
    if len(ev) > limit:
        out.append(("…", f"{len(ev) - limit} more"))
    return out


def compact(v: Any, depth: int = 0) -> str:
    """Short human text of an evidence value: frames as file:line, dicts as k: v, no JSON quotes."""
    if isinstance(v, dict):
        if "path" in v and "line" in v and len(v) <= 4:
            return frame_text(v)
        items = [(k, x) for k, x in v.items() if x not in (None, [], {}, "")]
        if depth >= 2:
            return "{…}"
        return "{" + ", ".join(f"{k}: {compact(x, depth + 1)}" for k, x in items) + "}"
    if isinstance(v, (list, tuple)):
        if depth >= 2 and v:
            return "[…]"
        shown = ", ".join(compact(x, depth + 1) for x in list(v)[:12])
        return "[" + shown + (", …" if len(v) > 12 else "") + "]"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _short(v: Any, width: int) -> str:
    s = " ".join(compact(v).split())
    return s if len(s) <= width else s[: width - 1] + "…"


def snippet_of(f: dict[str, Any], context: int = 2) -> dict[str, Any] | None:
    loc = f.get("location")
    if not isinstance(loc, dict):
        return None
    snip = loc.get("snippet")
    if isinstance(snip, dict) and snip.get("lines"):
        return snip
    return None  # renderers never open files: report.snippets attached what the job ran


def fmt_duration(s: Any) -> str:
    try:
        s = float(s)
    except (TypeError, ValueError):
        return ""
    if s < 1:
        return f"{s * 1000:.3g} ms"
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(round(s)), 60)
    return f"{m} min {sec:02d} s" if m < 60 else f"{m // 60} h {m % 60:02d} min"
