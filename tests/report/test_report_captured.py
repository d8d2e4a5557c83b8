"""The renderers fed with reports written by real `ddp-doctor run` jobs (tests/report/data/run_*.json).

Re-capture one with `ddp-doctor run --report tests/report/data/run_NAME.json ...` on the scenario of
the same name (tests/scenarios); the assertions name what a user must see, not the exact layout.
"""
from __future__ import annotations

import io
import json
from pathlib import Path

import jsonschema
import pytest

from ddp_doctor.report import REPORT_JSON_SCHEMA
from ddp_doctor.report.files import save_reports
from ddp_doctor.report.terminal import print_report

DATA = Path(__file__).with_name("data")
# report -> what the terminal text must contain
EXPECT = {
    "run_seed000_desync": ["DESYNC", "DDP202", "ddp.forward(broadcast_buffers) #49"],
    "run_allgather_shape_mismatch": ["CRASH", "DDP203", "all_gather", "shapes=[50,50], 50", "dtypes=int64",
                                     "SIGABRT"],
    "run_loader_stall": ["HANG", "DDP205", "__getitem__", "data_wait"],
    "run_seed_004_data_bound": ["DDP401", "num_workers=0"],
    "run_rank0_barrier": ["HANG", "DDP201", "barrier #0", "rank0_barrier.py:29"],
}


def _text(report: dict) -> str:
    buf = io.StringIO()
    print_report(report, file=buf)
    return buf.getvalue()


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_captured_report_renders_what_happened(name, tmp_path):
    report = json.loads((DATA / f"{name}.json").read_text(encoding="utf-8"))
    jsonschema.validate(report, REPORT_JSON_SCHEMA)
    text = " ".join(_text(report).split())
    for want in EXPECT[name]:
        assert want in text, (want, text[-3000:])
    html = tmp_path / "r.html"
    save_reports(report, None, str(html))
    page = html.read_text(encoding="utf-8")
    for f in report["findings"]:
        assert f["code"] in page


def test_every_captured_report_is_checked():
    assert {p.stem for p in DATA.glob("run_*.json")} == set(EXPECT)
