"""The schema check a plain install runs (``report.validate``, held to jsonschema's verdicts) and the
bounded reading of large saved reports (``report.load``)."""
from __future__ import annotations

import copy
import json
import random
from pathlib import Path

import jsonschema  # a test dependency: the reference the built-in validator is held to

from ddp_doctor.report import _view, load
from ddp_doctor.report.validate import schema_for, validate

DATA = Path(__file__).parent / "data"
ODD = ["x", 1, 1.5, 3.0, None, True, [], {}, [1], {"a": 1}, -1, "DDP999", "DDP12"]


def _paths(o, p=()):
    yield p
    if isinstance(o, dict):
        for k, v in o.items():
            yield from _paths(v, p + (k,))
    elif isinstance(o, list):
        for i, v in enumerate(o[:3]):
            yield from _paths(v, p + (i,))


def test_agrees_with_jsonschema_on_mutated_real_reports():
    rnd = random.Random(28)
    checked = refused = 0
    for f in sorted(DATA.glob("*.json")):
        doc = json.loads(f.read_text())
        assert validate(doc) == [], f
        paths = list(_paths(doc))[1:]
        for _ in range(120):
            m = copy.deepcopy(doc)
            p = rnd.choice(paths)
            parent = m
            for k in p[:-1]:
                parent = parent[k]
            if isinstance(parent, dict) and rnd.random() < 0.2:
                del parent[p[-1]]
            else:
                parent[p[-1]] = rnd.choice(ODD)
            if m.get("schema") != doc["schema"]:
                continue
            ours = validate(m)
            theirs = list(jsonschema.Draft7Validator(schema_for(m)).iter_errors(m))
            assert bool(ours) == bool(theirs), (f.name, p, ours, [e.message for e in theirs])
            checked += 1
            refused += bool(ours)
    assert checked > 450 and refused > 150, (checked, refused)


def test_first_problem_in_document_order():
    doc = json.loads((DATA / "run_rank0_barrier.json").read_text())
    doc["findings"] = "abc"
    doc["ranks"][0]["stack"] = 3
    assert validate(doc) == ["findings: 'abc' is not of type 'array'", "ranks/0/stack: 3 is not of type 'array'"]
    assert validate([1]) == ["(top level): [1] is not a JSON object"]


def _timelines(path: Path, ranks: int, events: int) -> None:
    doc = {"schema": "ddp-doctor/report/v1", "verdict": "ok", "exit_code": 0, "world_size": ranks,
           "findings": [], "ranks": [
               {"rank": r, "state": "finished", "epoch": 0, "step": events, "last_collective": None, "stack": [],
                "exit_code": 0, "signal": None, "evidence_like": {"t": 1.0, "kind": "x", "extra": 1},
                "timeline": [{"t": float(i), "kind": "step", "dur": 0.5, "label": f"step {i}"} for i in range(events)]}
               for r in range(ranks)]}
    path.write_text(json.dumps(doc))


def test_lean_load_keeps_each_ranks_last_events(tmp_path, monkeypatch):
    monkeypatch.setattr(_view, "TIMELINE_BUDGET", 4000)  # the real one, 200,000, scaled down with the report
    p = tmp_path / "big.json"
    _timelines(p, ranks=40, events=130)
    assert _view.timeline_cap(40) == 100
    full = load.load(str(p))
    lean = load.load(str(p), lean=True)
    assert len(full["ranks"][7]["timeline"]) == 130
    for r in lean["ranks"]:
        assert [e["t"] for e in r["timeline"]] == [float(i) for i in range(30, 130)]
        assert r["evidence_like"] == {"t": 1.0, "kind": "x", "extra": 1}
    assert all(r["timeline"] == [] for r in load.load(str(p), lean=True, timelines=False)["ranks"])
    assert validate(lean) == []


def test_html_page_holds_at_most_the_budget(tmp_path, monkeypatch):
    from ddp_doctor.report.html import render_html

    monkeypatch.setattr(_view, "TIMELINE_BUDGET", 4000)
    p = tmp_path / "big.json"
    _timelines(p, ranks=40, events=130)
    page = render_html(json.loads(p.read_text()))
    view = json.loads(page.split('id="ddp-view">', 1)[1].split("</script>", 1)[0])
    assert {len(r["timeline"]) for r in view["ranks"]} == {100}
    assert '"label":"step 29"' not in page and '"label":"step 30"' in page


def test_too_large_is_one_line_and_exit_2(tmp_path, monkeypatch, capsys):
    from ddp_doctor.cli import main

    p = tmp_path / "big.json"
    _timelines(p, ranks=40, events=2000)
    monkeypatch.setattr(load, "MEMORY_BUDGET", 1)
    assert main(["report", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"ddp-doctor report: {p} needs more than 0 MiB of memory"), err
    monkeypatch.setattr(load, "MAX_BYTES", 1000)
    assert main(["report", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "MiB, more than the 0 MiB ddp-doctor report reads; its JSON is intact" in err[0], err
