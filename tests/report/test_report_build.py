"""report_v1: the one builder of ddp-doctor/report/v1 documents."""
from __future__ import annotations

import pytest

from ddp_doctor.report import REPORT_SCHEMA_ID, report_v1
from ddp_doctor.report.validate import validate


def test_contract_keys_first_and_valid():
    doc = report_v1("hang", 2, [], [], source="attach", partial=False)
    assert list(doc)[:6] == ["schema", "verdict", "exit_code", "world_size", "findings", "ranks"]
    assert doc["schema"] == REPORT_SCHEMA_ID and doc["exit_code"] == 1 and doc["source"] == "attach"
    assert report_v1("ok", 2, [], [])["exit_code"] == 0 and report_v1("crash", 2, [], [], exit_code=137)["exit_code"] == 137
    assert validate(doc) == []


def test_extras_never_override_the_contract():
    with pytest.raises(ValueError, match="schema"):
        report_v1("ok", 1, [], [], schema="ddp-doctor/report/v0")
