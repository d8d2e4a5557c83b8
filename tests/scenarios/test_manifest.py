"""Fast consistency checks of the scenario library (no process is launched).

The per-scenario checks are table-driven: one test walks every scenario and reports every scenario that
fails it (the manifest is test data, not product code: one item per check, not one per scenario)."""
from __future__ import annotations

import json
import py_compile
import re
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import manifest  # noqa: E402

ALL = manifest.names()
CODE = re.compile(r"^DDP\d{3}$")


def _for_every_scenario(check) -> None:
    """Run ``check(name)`` for every scenario; fail once, listing every scenario whose check failed and why."""
    failed = []
    for name in ALL:
        try:
            check(name)
        except Exception as exc:  # (an AssertionError, or a KeyError of a malformed entry)
            failed.append(f"{name}: {type(exc).__name__}: {exc}")
    assert not failed, f"{len(failed)} of {len(ALL)} scenarios:\n" + "\n".join(failed)


def test_a_failing_check_names_every_scenario_it_fails():
    with pytest.raises(AssertionError) as info:
        _for_every_scenario(lambda n: manifest.entry(n)["no such key"])
    assert f"{len(ALL)} of {len(ALL)} scenarios" in str(info.value) and f"{ALL[-1]}: KeyError" in str(info.value)


def test_manifest_is_not_empty_and_covers_both_issues():
    assert len(ALL) >= 10
    assert manifest.names("run") and set(manifest.names("run")) | set(manifest.names("perf")) == set(ALL)


def test_every_script_in_the_folder_is_in_the_manifest():
    helpers = {"manifest.py", "conftest.py", "__init__.py"}
    on_disk = {p.stem for p in manifest.HERE.glob("*.py") if p.name not in helpers and not p.name.startswith("test_")}
    assert on_disk == set(ALL)


def _entry_is_well_formed(name):
    e = manifest.entry(name)
    assert manifest.script_path(name).is_file()
    assert e["issue"] in ("run", "perf")
    assert isinstance(e.get("args", []), list) and isinstance(e.get("env", {}), dict)
    assert int(e.get("nproc", 2)) >= 2
    exp = e["expect"]
    verdicts = [exp["verdict"]] if isinstance(exp["verdict"], str) else exp["verdict"]
    assert verdicts and set(verdicts) <= set(manifest.VERDICTS)
    for f in exp.get("findings", []):
        assert CODE.match(f["code"]), f
        assert f["ranks"] is None or all(isinstance(r, int) for r in f["ranks"])
        assert f["code"] not in exp.get("forbid", []), f"{f['code']} both expected and forbidden"
    assert all(CODE.match(c) for c in exp.get("forbid", []))
    assert e["plain_torchrun"] and e["why"]
    assert e["plain"]["outcome"] in ("exit0", "crash", "hang-timeout", "killed")
    assert isinstance(e["plain"]["exit_code"], int) and e["plain"]["seconds"] > 0


def _markers_exist_for_marker_findings(name):
    for f in manifest.entry(name)["expect"].get("findings", []):
        if f.get("marker"):
            line = manifest.marker_line(name, f["code"])
            assert "expect:" in manifest.script_path(name).read_text().splitlines()[line - 1]


def _every_marker_in_a_script_is_expected(name):
    codes_expected = {f["code"] for f in manifest.entry(name)["expect"].get("findings", []) if f.get("marker")}
    codes_marked = set(re.findall(r"#\s*expect:\s*(DDP\d{3})", manifest.script_path(name).read_text()))
    assert codes_marked == codes_expected


def _twins_exist_and_point_back(name):
    e = manifest.entry(name)
    if e.get("twin"):
        assert e["twin"] in ALL, e["twin"]
        assert name in manifest.entry(e["twin"]).get("twin_of", []), f"{e['twin']} does not list {name} in twin_of"
        assert manifest.entry(e["twin"])["expect"]["verdict"] == "ok"
    for bad in e.get("twin_of", []):
        assert bad in ALL
        assert e["expect"]["verdict"] == "ok" and e["plain"]["exit_code"] == 0
        assert not [f for f in e["expect"].get("findings", []) if f["code"] in e["expect"].get("forbid", [])]
    if not e.get("twin_of"):
        assert e["expect"]["verdict"] != "ok" or e["expect"].get("findings"), \
            "a scenario that is neither a twin nor expected to find anything"


def test_every_entry_is_well_formed():
    _for_every_scenario(_entry_is_well_formed)


def test_every_marker_finding_has_its_marker_and_every_marker_is_expected():
    _for_every_scenario(lambda n: (_markers_exist_for_marker_findings(n), _every_marker_in_a_script_is_expected(n)))


def test_every_twin_exists_and_points_back():
    _for_every_scenario(_twins_exist_and_point_back)


def test_every_script_compiles(tmp_path):
    _for_every_scenario(lambda name: py_compile.compile(str(manifest.script_path(name)), cfile=str(tmp_path / "x.pyc"),
                                                        doraise=True))


def test_torchrun_argv_shape():
    argv = manifest.torchrun_argv(ALL[0])
    assert argv[:2] == ["--nproc-per-node", str(manifest.entry(ALL[0]).get("nproc", 2))]
    assert str(manifest.script_path(ALL[0])) in argv


def _fake_report(name):
    exp = manifest.entry(name)["expect"]
    verdict = exp["verdict"] if isinstance(exp["verdict"], str) else exp["verdict"][0]
    findings = []
    for f in exp.get("findings", []):
        loc = None
        if f.get("marker"):
            loc = {"path": str(manifest.script_path(name)), "line": manifest.marker_line(name, f["code"]), "function": "main"}
        findings.append({"code": f["code"], "severity": "error", "ranks": f["ranks"] or [0], "location": loc})
    return {"verdict": verdict, "findings": findings}


def _report_problems_accepts_the_ideal_report(name):
    assert manifest.report_problems(name, _fake_report(name)) == []


def test_report_problems_accepts_every_ideal_report():
    _for_every_scenario(_report_problems_accepts_the_ideal_report)


def test_report_problems_catches_mistakes():
    bad = next(n for n in ALL if any(f.get("marker") for f in manifest.entry(n)["expect"].get("findings", [])))
    rep = _fake_report(bad)
    rep["findings"][0]["location"]["line"] += 1
    assert any("location" in p for p in manifest.report_problems(bad, rep))
    rep = _fake_report(bad)
    rep["findings"][0]["ranks"] = [7]
    assert any("ranks" in p for p in manifest.report_problems(bad, rep))
    rep = _fake_report(bad)
    rep["verdict"] = "ok"
    assert any("verdict" in p for p in manifest.report_problems(bad, rep))
    twin = manifest.entry(bad)["twin"]
    rep = {"verdict": "ok", "findings": [{"code": "DDP201", "severity": "error", "ranks": [0], "location": None}]}
    problems = manifest.report_problems(twin, rep)
    assert any("forbidden" in p for p in problems) and any("twin" in p for p in problems)
    lint_only = {"verdict": "ok", "findings": [{"code": "DDP201", "severity": "error", "source": "lint",
                                                "ranks": [], "location": None}]}
    assert manifest.report_problems(twin, lint_only) == []


def test_run_command_kills_the_group_on_timeout():
    res = manifest.run_command([sys.executable, "-c", "import subprocess, sys, time; "
                                "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); time.sleep(60)"],
                               timeout=1.5)
    assert res.timed_out and res.returncode is not None
    assert len(res.pids) >= 1
    manifest.assert_no_leftovers(res)


def test_json_is_valid_and_sorted_by_nothing_in_particular():
    data = json.loads(manifest.MANIFEST_JSON.read_text())
    assert data["schema"] == "ddp-doctor/scenarios/v1"


def test_report_problems_wants_hangs_stopped_before_the_pg_timeout():
    rep = _fake_report("rank0_barrier")
    assert manifest.report_problems("rank0_barrier", dict(rep, duration_s=30.0)) == []
    assert any("timeout" in p for p in manifest.report_problems("rank0_barrier", dict(rep, duration_s=95.0)))


def test_torchrun_argv_two_nodes_keeps_the_world_size():
    argv = manifest.torchrun_argv("rank0_barrier", endpoint="127.0.0.1:30123", nnodes=2, node_rank=1)
    assert argv[:2] == ["--nproc-per-node", "1"]
    assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "1"
    with pytest.raises(ValueError):
        manifest.torchrun_argv("rank0_barrier", nnodes=2)


def test_run_command_reaches_descendants_in_other_sessions():
    # like torch's launcher: the rank runs in its own session, out of reach of killpg
    code = ("import subprocess, sys, time; "
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True); "
            "time.sleep(60)")
    res = manifest.run_command([sys.executable, "-c", code], timeout=2.0, leftover_grace_s=1.0)
    assert res.timed_out
    assert len(res.pids) >= 2, "the grandchild in its own session was not tracked"
    assert res.leftovers, "a descendant that survived the group kill must be reported"
    manifest.assert_no_leftovers(res)  # ... and it was killed before run_command returned


def test_docs_table_is_up_to_date():
    doc = manifest.HERE.parents[1] / "docs" / "scenarios.md"
    if not doc.exists():
        pytest.skip("docs/scenarios.md not in this checkout")
    text = doc.read_text()
    assert manifest.markdown_table() in text and manifest.markdown_coverage() in text, \
        "regenerate the tables: python tests/scenarios/manifest.py table --write"


def test_torch_teardown_abort_is_recognised_only_as_diagnosed():
    teardown = {"code": "DDP204", "severity": "error", "evidence": {"finished_program": True}}
    assert manifest.torch_teardown_abort({"verdict": "crash", "findings": [teardown]})
    assert not manifest.torch_teardown_abort({"verdict": "crash", "findings": [teardown, {"code": "DDP201",
                                                                                          "severity": "error"}]})
    assert not manifest.torch_teardown_abort({"verdict": "crash", "findings": [dict(teardown, evidence={})]})
    assert not manifest.torch_teardown_abort({"verdict": "hang", "findings": [teardown]})
