"""The performance family's helpers over a job's evidence in its wire form (``JobEvidence.to_json()``'s dicts,
which ``diagnose/perf.py`` and ``diagnose/gpu_memory.py`` read): the ranks on record, a site as a finding's
location and in words.  Below both, so neither imports the other's helpers."""
from __future__ import annotations

import os
from typing import Any

from ddp_doctor.findings import Location


def wire_ranks(ev: dict[str, Any]) -> dict[int, dict[str, Any]]:
    out = {}
    for r, st in (ev.get("ranks") or {}).items():
        if isinstance(st, dict) and not st.get("missing"):
            out[int(r)] = st
    return dict(sorted(out.items()))


def wire_loc(site: dict[str, Any] | None) -> Location | None:
    if not site or not site.get("path") or not site.get("line"):
        return None
    return Location(site["path"], int(site["line"]), site.get("function"))


def wire_where(site: dict[str, Any] | None) -> str:
    if not site or not site.get("path"):
        return "an unknown line"
    return f"{os.path.basename(site['path'])}:{site.get('line')}"
