"""Everything that formats findings for people or machines lives under ``ddp_doctor.report``.

This module holds the JSON contracts of DESIGN.md (as JSON Schemas, so tests and
users can validate against them) and the JSON read/write of runtime reports.
"""
from __future__ import annotations

import json
import os
from typing import Any

from ddp_doctor.findings import Severity
from ddp_doctor.report.ranks import RANK_KEYS

LINT_SCHEMA_ID = "ddp-doctor/lint/v1"
REPORT_SCHEMA_ID = "ddp-doctor/report/v1"
# `ddp-doctor check --report`: report/v1 keys plus per-test results (see ddp_doctor.check).
CHECK_SCHEMA_ID = "ddp-doctor/check/v1"

_NULLABLE_STR = {"type": ["string", "null"]}
_NULLABLE_INT = {"type": ["integer", "null"]}
_CODE = {"type": "string", "pattern": "^DDP[0-9]{3}$"}
_SEVERITY = {"enum": [s.value for s in Severity]}
_FRAME = {
    "type": "object",
    "required": ["path", "line", "function"],
    "properties": {"path": {"type": "string"}, "line": _NULLABLE_INT, "function": _NULLABLE_STR},
}

_NULLABLE_NUM = {"type": ["number", "null"]}
_SNIPPET = {"type": "object", "properties": {"start": _NULLABLE_INT, "lines": {"type": "array", "items": {"type": "string"}}}}
_LOCATION = {**_FRAME, "properties": {**_FRAME["properties"], "snippet": _SNIPPET}}
_FINDING = {
    "type": "object",
    "required": ["code", "name", "severity", "title", "message", "ranks", "location", "evidence", "fix"],
    "properties": {
        "code": _CODE, "name": {"type": "string"}, "severity": _SEVERITY,
        "title": {"type": "string"}, "message": {"type": "string"},
        "ranks": {"type": "array", "items": {"type": "integer"}},
        "location": {"oneOf": [{"type": "null"}, _LOCATION]},
        "evidence": {"type": "object"}, "fix": {"type": "string"}, "source": {"type": "string"},
    },
}
_STACK = {"type": "array", "items": _FRAME}
# the optional extensions renderers use (docs/report.md): absent is fine, present must have this shape
_RANK_EXTRAS = {
    "host": _NULLABLE_STR, "pid": _NULLABLE_INT, "local_rank": _NULLABLE_INT,
    "where": {"oneOf": [{"type": "null"}, _FRAME]},
    "workers": {"type": "array", "items": {"type": "object", "properties": {"pid": _NULLABLE_INT, "stack": _STACK}}},
    "timing": {"type": ["object", "null"], "properties": {k: _NULLABLE_NUM for k in (
        "steps", "step_time_s", "data_wait_s", "compute_s", "collective_s")}},
    "timeline": {"type": "array", "items": {"type": "object", "required": ["t", "kind"], "properties": {
        "t": {"type": "number"}, "kind": {"type": "string"}, "dur": _NULLABLE_NUM, "label": _NULLABLE_STR}}},
    "exc": {"type": ["object", "null"]},
}
_REPORT_EXTRAS = {
    "command": {"type": "array"}, "started_at": _NULLABLE_STR, "duration_s": _NULLABLE_NUM,
    "hang_timeout_s": _NULLABLE_NUM, "nnodes": {"type": ["string", "integer", "null"]},
    "lint": {"type": ["object", "null"], "properties": {"path": _NULLABLE_STR,
                                                        "findings": {"type": "array", "items": _FINDING}}},
    "sources": {"type": "array", "items": {"type": "string"}},
    "side_channel": {"type": ["object", "null"]}, "detection": {"type": ["object", "null"]},
    "attempt": _NULLABLE_INT,
    "restarts": {"type": "array", "items": {"type": "object", "properties": {
        "findings": {"type": "array", "items": _FINDING}, "ranks": {"type": "array"}}}},
    "errors": {"type": "array", "items": {"type": "object"}},
    # a finding's claims that the report's own evidence contradicts (report/facts.py): empty, or our bug
    "contradictions": {"type": "array", "items": {"type": "object", "required": ["code", "claim", "fact"]}},
    "diagnosis_error": {"type": "string"},  # the diagnosis raised (our bug): verdict and ranks kept, no finding
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
        # stalled: written at a stall while the job runs on (exit_code null); the report at the end replaces it
        "verdict": {"enum": ["ok", "stalled", "hang", "crash", "desync", "interrupted"]},
        "exit_code": _NULLABLE_INT,
        "world_size": {"type": "integer", "minimum": 0},
        # how the ranks were started ("ddp-doctor run", "torchrun", "lightning (subprocess)", "ray train"...:
        # ddp_doctor.session.launcher), and where the embedded watcher wrote this report (absolute)
        "launcher": {"type": "string"},
        "report_path": {"type": "string"},
        "findings": {"type": "array", "items": _FINDING},
        "ranks": {
            "type": "array",
            "items": {
                "type": "object",
                "required": list(RANK_KEYS),
                "properties": {
                    "rank": {"type": "integer"}, "state": {"type": "string"},
                    "epoch": _NULLABLE_INT, "step": _NULLABLE_INT,
                    "last_collective": {"type": ["object", "null"]},
                    "stack": _STACK,
                    "exit_code": _NULLABLE_INT, "signal": _NULLABLE_STR,
                    **_RANK_EXTRAS,
                },
            },
        },
        **_REPORT_EXTRAS,
    },
}


def _check_json_schema() -> dict[str, Any]:
    """``ddp-doctor check --report``: report/v1's keys plus tests, bandwidth and audit."""
    import copy

    schema = copy.deepcopy(REPORT_JSON_SCHEMA)
    schema["required"] = schema["required"] + ["tests", "bandwidth", "audit", "nnodes", "deadline_s"]
    props = schema["properties"]
    props["schema"] = {"const": CHECK_SCHEMA_ID}
    props["verdict"] = {"enum": ["ok", "fail"]}
    props["findings"]["items"]["properties"]["source"] = {"const": "check"}
    status = {"enum": ["pass", "skip", "fail", "not-run"]}
    rank_status = {"enum": ["pass", "skip", "fail", "timeout", "error", "hung", "exited", "not-run"]}
    props["tests"] = {"type": "array", "items": {
        "type": "object", "required": ["name", "status", "ranks", "duration_s"],
        "properties": {
            "name": {"type": "string"}, "status": status, "duration_s": {"type": "number"},
            "ranks": {"type": "array", "items": {"type": "object", "required": ["rank", "status"],
                                                 "properties": {"rank": {"type": "integer"}, "status": rank_status}}},
            "pairs": {"type": "array", "items": {"type": "object", "required": ["pair", "status"]}},
        }}}
    props["bandwidth"] = {"type": "array", "items": {
        "type": "object", "required": ["bytes", "time_s", "algbw_GBps", "busbw_GBps", "ok"]}}
    props["audit"] = {"type": "array", "items": {"type": "object", "required": ["node", "checks"]}}
    return schema


#: JSON Schema of ``ddp-doctor check --report``.
CHECK_JSON_SCHEMA = _check_json_schema()


REPORT_KEYS = ("schema", "verdict", "exit_code", "world_size", "findings", "ranks")


def report_v1(verdict: str, world_size: int, findings: list[dict[str, Any]], ranks: list[dict[str, Any]],
              exit_code: int | None = None, **extra: Any) -> dict[str, Any]:
    """The one builder of a ``ddp-doctor/report/v1`` document (``run``, ``attach`` and its merge, Flight Recorder,
    the demo): the contract's keys first, then what the source adds (``extra``, never a contract key).
    ``findings``: report/v1 finding objects (``Finding.to_report_dict``); ``exit_code`` defaults to 0 when the
    verdict is ok, else 1."""
    clash = set(extra) & set(REPORT_KEYS)
    if clash:
        raise ValueError(f"report/v1 keys given as extras: {sorted(clash)}")
    code = (0 if verdict == "ok" else 1) if exit_code is None else exit_code
    return {"schema": REPORT_SCHEMA_ID, "verdict": verdict, "exit_code": code, "world_size": world_size,
            "findings": findings, "ranks": ranks, **extra}


def report_json(data: dict[str, Any]) -> str:
    """A report as the text its JSON file holds: strict UTF-8 JSON (:func:`ddp_doctor.utf8.strict`: a file name
    that is not UTF-8 is written readably, its bytes kept beside it as ``..._b64``)."""
    text = json.dumps(data, indent=2, sort_keys=False) + "\n"
    if "\\ud" in text:  # json.dumps escapes a surrogate so (rare; the walk would cost a large report seconds)
        from ddp_doctor.utf8 import strict

        text = json.dumps(strict(data), indent=2, sort_keys=False) + "\n"
    return text


def write_json(data: dict[str, Any], path: str | os.PathLike[str]) -> None:
    """Write a report atomically (a half-written report is worse than none); OSError is the caller's
    (commands use :func:`ddp_doctor.report.files.save`, which falls back and never raises)."""
    from ddp_doctor.atomic import write_atomic

    write_atomic(path, report_json(data))
