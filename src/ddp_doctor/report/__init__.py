"""Everything that formats findings for people or machines lives under ``ddp_doctor.report``.

This module holds the JSON contracts of DESIGN.md (as JSON Schemas, so tests and
users can validate against them) and the JSON read/write of runtime reports.
"""
from __future__ import annotations

import json
import os
from typing import Any

LINT_SCHEMA_ID = "ddp-doctor/lint/v1"
REPORT_SCHEMA_ID = "ddp-doctor/report/v1"
# `ddp-doctor check --report`: report/v1 keys plus per-test results (see ddp_doctor.check).
CHECK_SCHEMA_ID = "ddp-doctor/check/v1"

_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_CODE = {"type": "string", "pattern": "^DDP[0-9]{3}$"}
_SEVERITY = {"enum": ["error", "warning", "info"]}
_FRAME = {
    "type": "object",
    "required": ["path", "line", "function"],
    "properties": {"path": {"type": "string"}, "line": _NULLABLE_INT, "function": _NULLABLE_STR},
}

LINT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "findings", "errors"],
    "properties": {
        "schema": {"const": LINT_SCHEMA_ID},
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["code", "name", "severity", "path", "line", "column",
                             "end_line", "end_column", "message", "fix"],
                "properties": {
                    "code": _CODE, "name": {"type": "string"}, "severity": _SEVERITY,
                    "path": {"type": "string"}, "line": {"type": "integer"}, "column": {"type": "integer"},
                    "end_line": _NULLABLE_INT, "end_column": _NULLABLE_INT,
                    "message": {"type": "string"}, "fix": {"type": "string"},
                },
            },
        },
        "errors": {
            "type": "array",
            "items": {"type": "object", "required": ["path", "message"],
                      "properties": {"path": {"type": "string"}, "message": {"type": "string"}}},
        },
    },
}

REPORT_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["schema", "verdict", "exit_code", "world_size", "findings", "ranks"],
    "properties": {
        "schema": {"const": REPORT_SCHEMA_ID},
        "verdict": {"enum": ["ok", "hang", "crash", "desync", "interrupted"]},
        "exit_code": {"type": "integer"},
        "world_size": {"type": "integer", "minimum": 0},
        "findings": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["code", "name", "severity", "title", "message", "ranks", "location", "evidence", "fix"],
                "properties": {
                    "code": _CODE, "name": {"type": "string"}, "severity": _SEVERITY,
                    "title": {"type": "string"}, "message": {"type": "string"},
                    "ranks": {"type": "array", "items": {"type": "integer"}},
                    "location": {"oneOf": [{"type": "null"}, _FRAME]},
                    "evidence": {"type": "object"}, "fix": {"type": "string"},
                },
            },
        },
        "ranks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["rank", "state", "epoch", "step", "last_collective", "stack", "exit_code", "signal"],
                "properties": {
                    "rank": {"type": "integer"}, "state": {"type": "string"},
                    "epoch": _NULLABLE_INT, "step": _NULLABLE_INT,
                    "last_collective": {"type": ["object", "null"]},
                    "stack": {"type": "array", "items": _FRAME},
                    "exit_code": _NULLABLE_INT, "signal": _NULLABLE_STR,
                },
            },
        },
    },
}


def report_json(data: dict[str, Any]) -> str:
    """A report as the text its JSON file holds."""
    return json.dumps(data, indent=2, sort_keys=False) + "\n"


def write_json(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a report atomically (a half-written report is worse than none); OSError is the caller's
    (commands use :func:`ddp_doctor.report.files.save`, which falls back and never raises)."""
    from ddp_doctor.report.files import write_atomic

    write_atomic(path, report_json(data))
