"""``ddp-doctor check``: a pre-flight self-test of the environment and of every rank's links.

Pieces (each usable alone):

- :mod:`.plan` — the ordered tests, sizes, the nccl-tests bus-bandwidth formula;
- :mod:`.faults` — fault injection for tests (``DDP_DOCTOR_CHECK_FAULT``);
- :mod:`.audit` — the per-node environment audit (shm, limits, CPUs, env vars, versions);
- :mod:`.worker` — runs in every rank (started through torch's elastic launcher);
- :mod:`.monitor` — runs in the launcher: side channel (TCPStore), deadlines, stopping;
- :mod:`.diagnose` — per-test results -> findings (DDP5xx) and the check report dict.

Rendering lives in :mod:`ddp_doctor.report.check_view`.
"""
from __future__ import annotations

from ddp_doctor.report import CHECK_SCHEMA_ID  # noqa: E402,F401 - one constant, defined in report


def _check_json_schema() -> dict:
    import copy

    from ddp_doctor.report import REPORT_JSON_SCHEMA

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


#: JSON Schema of ``ddp-doctor check --report`` (report/v1's keys plus tests, bandwidth, audit).
CHECK_JSON_SCHEMA = _check_json_schema()
