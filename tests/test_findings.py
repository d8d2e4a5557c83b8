import re

import pytest

from ddp_doctor.findings import CATALOGUE, Finding, Location, Severity, info


def test_catalogue_codes_and_names_are_well_formed_and_unique():
    names = [entry.name for entry in CATALOGUE.values()]
    assert len(names) == len(set(names))
    for code, entry in CATALOGUE.items():
        assert re.fullmatch(r"DDP\d{3}", code) and entry.code == code
        assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", entry.name)


def test_finding_defaults_come_from_catalogue_and_round_trip_through_report_dict():
    f = Finding("DDP201", "barrier on rank 0 only", "move it out", Location("t.py", 3, "main"), ranks=[1, 0])
    assert f.severity is Severity.ERROR and f.name == "rank-conditional-collective"
    d = f.to_report_dict()
    assert d["ranks"] == [0, 1] and d["location"] == {"path": "t.py", "line": 3, "function": "main"}
    assert Finding.from_report_dict(d).to_report_dict() == d


def test_unknown_code_is_rejected():
    with pytest.raises(KeyError):
        info("DDP999")


def test_every_catalogue_code_has_an_explain_page_with_the_four_sections():
    from importlib import resources

    pages = resources.files("ddp_doctor") / "pages"
    for code, entry in CATALOGUE.items():
        text = (pages / f"{code}.md").read_text(encoding="utf-8")
        assert text.startswith(f"# {code} {entry.name}\n"), code
        for heading in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
            assert heading in text, (code, heading)
