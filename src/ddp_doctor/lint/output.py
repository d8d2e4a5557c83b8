"""Lint output formats: text (ruff-like), json (DESIGN contract), sarif (2.1.0), github (workflow annotations)."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from ddp_doctor import __version__
from ddp_doctor.findings import CATALOGUE, Finding
from ddp_doctor.lint.engine import LintResult
from ddp_doctor.lint.rules import RULE_CODES
from ddp_doctor.utf8 import strict

FORMATS = ("text", "json", "sarif", "github")


def _sev_counts(findings: list[Finding]) -> dict[str, int]:
    out = {"error": 0, "warning": 0, "info": 0}
    for f in findings:
        out[f.severity.value] += 1
    return out


def format_text(result: LintResult, *, color: bool = False, show_source: bool = True, fixed: int = 0) -> str:
    def c(code: str, s: str) -> str:
        return f"\x1b[{code}m{s}\x1b[0m" if color else s

    sev_color = {"error": "31;1", "warning": "33;1", "info": "36;1"}
    out: list[str] = []
    for f in result.findings:
        loc = f.location
        out.append(f"{c('1', f'{loc.path}:{loc.line}:{loc.column or 1}:')} "
                   f"{c(sev_color[f.severity.value], f.code)} {f.message}")
        for r in f.evidence.get("related", ()):
            out.append(f"    = related: {r['path']}:{r['line']}: {r['message']}")
        src = result.sources.get(loc.path)
        if show_source and src is not None:
            lines = src.splitlines()
            if 0 < loc.line <= len(lines):
                text = lines[loc.line - 1].rstrip("\n").expandtabs(4)
                width = len(str(loc.line))
                col = (loc.column or 1) - 1
                if loc.end_line == loc.line and loc.end_column:
                    span = max(1, loc.end_column - (loc.column or 1))
                else:  # the statement goes on: underline to the end of the code on this line
                    code_part = text.split("  #", 1)[0].rstrip()
                    span = max(1, len(code_part) - col)
                pad = " " * width
                out.append(f" {pad} |")
                out.append(f" {loc.line} | {text}")
                out.append(f" {pad} | {' ' * col}{c(sev_color[f.severity.value], '^' * span)} "
                           f"{f.code} {f.name} ({f.severity.value})")
                out.append(f" {pad} = fix: {f.fix}")
                out.append("")
                continue
        out.append(f"    = fix: {f.fix}")
        out.append("")
    for e in result.errors:
        out.append(f"{c('1', e.path + ':')} {c('31;1', 'error:')} {e.message}")
    n = _sev_counts(result.findings)
    total = len(result.findings)
    if total or result.errors:
        parts = [f"{n[k]} {k}{'s' if n[k] != 1 and k != 'info' else ''}" for k in ("error", "warning", "info")
                 if n[k]]
        line = f"Found {total} finding{'s' if total != 1 else ''}"
        if parts:
            line += " (" + ", ".join(parts) + ")"
        line += f" in {result.files} file{'s' if result.files != 1 else ''}."
        if result.errors:
            line += f" {len(result.errors)} file{'s' if len(result.errors) != 1 else ''} could not be linted."
        fixable = sum(len(v) for v in result.fixes.values())
        if fixable:
            line += f" {fixable} fixable with --fix."
        out.append(line)
    else:
        out.append(f"All checks passed ({result.files} file{'s' if result.files != 1 else ''}).")
    if fixed:
        out.append(f"Fixed {fixed} finding{'s' if fixed != 1 else ''}.")
    return "\n".join(out) + "\n"


def format_json(result: LintResult) -> str:
    return json.dumps(strict(result.to_lint_dict()), indent=2) + "\n"


def _uri(path: str) -> str:
    p = Path(path)
    try:
        rel = p.resolve().relative_to(Path(os.getcwd()).resolve())
        return quote(rel.as_posix())
    except ValueError:
        return p.resolve().as_uri()


_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}


def format_sarif(result: LintResult) -> str:
    rules = []
    index = {}
    for i, code in enumerate(RULE_CODES):
        entry = CATALOGUE[code]
        index[code] = i
        rules.append({
            "id": code,
            "name": entry.name,
            "shortDescription": {"text": entry.title},
            "help": {"text": f"Run `ddp-doctor explain {code}` for what it does, why it is bad and what to use instead."},
            "defaultConfiguration": {"level": _SARIF_LEVEL[entry.severity.value]},
        })
    results = []
    for f in result.findings:
        loc = f.location
        region = {"startLine": loc.line, "startColumn": loc.column or 1}
        if loc.end_line:
            region["endLine"] = loc.end_line
        if loc.end_column and (loc.end_line or loc.line) >= loc.line:
            region["endColumn"] = loc.end_column
        res = {
            "ruleId": f.code,
            "level": _SARIF_LEVEL[f.severity.value],
            "message": {"text": f"{f.message} Fix: {f.fix}"},
            "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(loc.path)}, "region": region}}],
        }
        if f.code in index:
            res["ruleIndex"] = index[f.code]
        related = f.evidence.get("related", ())
        if related:
            res["relatedLocations"] = [{
                "id": i,
                "message": {"text": r["message"]},
                "physicalLocation": {"artifactLocation": {"uri": _uri(r["path"])},
                                     "region": {"startLine": r["line"]}},
            } for i, r in enumerate(related)]
        results.append(res)
    notifications = [{
        "level": "error",
        "message": {"text": e.message},
        "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(e.path)}}}],
    } for e in result.errors]
    doc = {
        "$schema": "https://json.schemastore.org/sarif-2.1.0.json",
        "version": "2.1.0",
        "runs": [{
            "tool": {"driver": {
                "name": "ddp-doctor",
                "version": __version__,
                "rules": rules,
            }},
            "invocations": [{"executionSuccessful": not result.errors,
                             "toolExecutionNotifications": notifications}],
            "results": results,
        }],
    }
    return json.dumps(strict(doc), indent=2) + "\n"


def _gh_escape(s: str, prop: bool = False) -> str:
    s = s.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        s = s.replace(":", "%3A").replace(",", "%2C")
    return s


_GH_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def format_github(result: LintResult) -> str:
    out = []
    for f in result.findings:
        loc = f.location
        props = [f"file={_gh_escape(loc.path, True)}", f"line={loc.line}", f"col={loc.column or 1}"]
        if loc.end_line:
            props.append(f"endLine={loc.end_line}")
        if loc.end_column and loc.end_line == loc.line:
            props.append(f"endColumn={loc.end_column}")
        props.append(f"title={_gh_escape(f'{f.code} {f.name}', True)}")
        see = "".join(f" (related: {r['path']}:{r['line']}: {r['message']})" for r in f.evidence.get("related", ()))
        text = f"{f.message}{see} Fix: {f.fix}"
        out.append(f"::{_GH_LEVEL[f.severity.value]} {','.join(props)}::{_gh_escape(text)}")
    for e in result.errors:
        out.append(f"::error file={_gh_escape(e.path, True)},title=ddp-doctor::{_gh_escape(e.message)}")
    return "\n".join(out) + ("\n" if out else "")


FORMATTERS: dict[str, Callable[..., str]] = {
    "text": format_text, "json": format_json, "sarif": format_sarif, "github": format_github,
}
