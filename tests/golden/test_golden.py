"""Golden texts: every runtime finding's wording, pinned.

captures/NAME.json is what the diagnosis saw in a real ``ddp-doctor run`` job (tests/golden/capture.py);
synthetic/NAME.json the same format written by hand for cases no CPU job can produce here (a GPU, a
restart on a stale store).  Each is diagnosed again and its findings rendered as plain text; the text
must equal expected/NAME.txt.  After an intended wording change:

    DDP_DOCTOR_UPDATE_GOLDEN=1 python -m pytest tests/golden -q     # then review the diff like code
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddp_doctor.diagnose import diagnose
from ddp_doctor.evidence import Capture
from ddp_doctor.findings import CATALOGUE

HERE = Path(__file__).parent
CASES = sorted((HERE / "captures").glob("*.json")) + sorted((HERE / "synthetic").glob("*.json"))
UPDATE = os.environ.get("DDP_DOCTOR_UPDATE_GOLDEN") == "1"
# runtime codes of the catalogue whose text must be pinned by at least one case
RUNTIME_CODES = {"DDP101", "DDP102", "DDP201", "DDP202", "DDP203", "DDP204", "DDP205", "DDP301", "DDP302",
                 "DDP401", "DDP403", "DDP404", "DDP405", "DDP501", "DDP510"}


def render(path: Path) -> str:
    # the capture's paths point at this checkout again: the diagnosis reads the scripts (the decision's source)
    text = path.read_text(encoding="utf-8").replace('"/checkout/', f'"{HERE.parents[1]}/')
    capture = Capture.from_json(json.loads(text))
    verdict, findings = diagnose(*capture.args())
    out = [f"verdict: {verdict}"]
    for f in findings:
        where = f"{os.path.basename(f.location.path)}:{f.location.line}" if f.location else "-"
        out += [f"{f.code} {f.severity.value} ranks={sorted(f.ranks)} at {where}", f"  {f.message}", f"  fix: {f.fix}"]
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("case", CASES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_golden_text(case):
    expected = HERE / "expected" / f"{case.stem}.txt"
    text = render(case)
    if UPDATE:
        expected.write_text(text, encoding="utf-8")
    assert expected.exists(), f"no golden text for {case.name}: run with DDP_DOCTOR_UPDATE_GOLDEN=1"
    assert text == expected.read_text(encoding="utf-8")


def test_every_runtime_code_is_pinned():
    seen = set()
    for p in (HERE / "expected").glob("*.txt"):
        seen |= {line.split()[0] for line in p.read_text(encoding="utf-8").splitlines() if line[:3] == "DDP"}
    assert RUNTIME_CODES <= set(CATALOGUE)
    assert RUNTIME_CODES <= seen, sorted(RUNTIME_CODES - seen)
