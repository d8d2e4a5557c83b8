"""``ddp-doctor check``: a pre-flight self-test of the environment and of every rank's links.

Pieces (each usable alone):

- :mod:`.plan` — the ordered tests, sizes, the nccl-tests bus-bandwidth formula;
- :mod:`.faults` — fault injection for tests (``DDP_DOCTOR_CHECK_FAULT``);
- :mod:`.audit` — the per-node environment audit (shm, limits, CPUs, env vars, versions);
- :mod:`.worker` — runs in every rank (started through torch's elastic launcher);
- :mod:`.monitor` — runs in the launcher: side channel (TCPStore), deadlines, stopping;
- :mod:`.results` — per-test results -> findings (DDP5xx) and the check report dict.

Rendering lives in :mod:`ddp_doctor.report.check_view`.
"""
from __future__ import annotations

# the schemas of every ddp-doctor document are defined in report/ (one place)
from ddp_doctor.report import CHECK_JSON_SCHEMA, CHECK_SCHEMA_ID  # noqa: E402,F401
