"""The shipped demo scripts (seed 000) and ``ddp-doctor demo``."""
import difflib
import os
import signal
import subprocess
import sys

import pytest

from ddp_doctor.demo import script_source

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_fix_is_one_line():
    buggy, fixed = script_source("buggy").splitlines(), script_source("fixed").splitlines()
    changed = [ln for ln in difflib.unified_diff(buggy, fixed, lineterm="", n=0)
               if ln[:1] in "+-" and not ln.startswith(("+++", "---"))]
    code = [ln for ln in changed if '"""' not in ln and not ln[1:].startswith(("    ddp-doctor", "collective", "through"))]
    assert any("validate(model, val_loader)" in ln for ln in code if ln.startswith("-"))
    assert any("validate(model.module, val_loader)" in ln for ln in code if ln.startswith("+"))
    assert len(code) == 2, changed


@pytest.mark.scenario
def test_demo_end_to_end(tmp_path):
    """`ddp-doctor demo`: lint flags the bug, run diagnoses the buggy job, the fixed job runs clean."""
    import json
    out = tmp_path / "demo"
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "src") + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", COLUMNS="120")
    env.pop("NO_COLOR", None)
    proc = subprocess.Popen([sys.executable, "-m", "ddp_doctor", "demo", "--out", str(out)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=240)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, _ = proc.communicate()
        pytest.fail("demo did not finish in 240 s:\n" + text[-4000:])
    assert proc.returncode == 0, text[-4000:]
    assert "\x1b[" not in text, "not a TTY: plain output"
    buggy = json.loads((out / "buggy-report.json").read_text())
    fixed = json.loads((out / "fixed-report.json").read_text())
    assert buggy["verdict"] in ("hang", "desync", "crash") and buggy["exit_code"] != 0
    runtime = [f for f in buggy["findings"] if f.get("source") != "lint"]
    assert any(f["code"] in ("DDP202", "DDP203") and 0 in f["ranks"] for f in runtime), runtime
    lint = (buggy.get("lint") or {}).get("findings", []) + [f for f in buggy["findings"] if f.get("source") == "lint"]
    assert any(f["code"] == "DDP202" for f in lint + runtime), "the lint finding of the buggy script is in the report"
    assert fixed["verdict"] == "ok" and fixed["exit_code"] == 0
    assert not [f for f in fixed["findings"] if f["severity"] == "error"]
    for name in ("buggy-report.html", "fixed-report.html", "train_buggy.py", "train_fixed.py"):
        assert (out / name).exists(), name
    assert "DDP202" in text and "summary" in text and "fixed train_fixed.py: OK (exit 0)" in text
