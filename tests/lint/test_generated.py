"""A fixed sample of benchmarks/lint_cases.py (issue 36): generated multi-file projects whose hazard line
is known by construction, each with its correct twin, and clean look-alikes.  Every project of the sample
must be judged right: the finding on the marked line, nothing on the twin or the look-alike."""
import importlib.util
import random
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lint_cases", ROOT / "benchmarks" / "lint_cases.py")
lint_cases = importlib.util.module_from_spec(_spec)
sys.modules["lint_cases"] = lint_cases  # dataclasses look their module up by name
_spec.loader.exec_module(lint_cases)


# forms the analysis does not reach yet (benchmarks/RESULTS.md counts them): a collate_fn of another file
# (DDP104 is judged in the collate function's own file, which nothing there ties to a DataLoader).  A miss
# of such a form is expected; once one is found the entry must go (the test fails on a known gap found).
KNOWN_GAPS = {("DDP104", "module")}


def test_a_fixed_sample_of_generated_projects_is_judged_right(tmp_path):
    cases = lint_cases.generate(40, seed=36)
    outcomes = lint_cases.run(cases, tmp_path)
    wrong = [(o.case.kind, o.case.code, o.case.form, o.case.truth, o.findings, o.errors)
             for o in outcomes if not o.ok and (o.case.kind != "bug" or (o.case.code, o.case.form) not in KNOWN_GAPS)]
    assert wrong == []
    gaps = [o for o in outcomes if o.case.kind == "bug" and (o.case.code, o.case.form) in KNOWN_GAPS]
    assert all(not o.ok for o in gaps), "a known gap is found now: remove it from KNOWN_GAPS"
    kinds = {o.case.kind for o in outcomes}
    assert kinds == {"bug", "twin", "lookalike"}
    assert len({(o.case.code, o.case.form) for o in outcomes if o.case.kind == "bug"}) >= 20


def test_every_template_marks_one_line_and_its_twin_none():
    for (code, form), template in lint_cases.TEMPLATES.items():
        names = lint_cases.Names.draw(random.Random(hash((code, form)) & 0xFFFF))
        _files, marks = lint_cases.strip_marks(template(names, random.Random(1), False))
        assert len(marks) == 1, (code, form, marks)
        _files, marks = lint_cases.strip_marks(template(names, random.Random(1), True))
        assert marks == [], (code, form)


def test_generation_is_reproducible():
    a = [(c.code, c.form, c.kind, c.truth, c.files) for c in lint_cases.generate(12, seed=5)]
    b = [(c.code, c.form, c.kind, c.truth, c.files) for c in lint_cases.generate(12, seed=5)]
    assert a == b


@pytest.mark.parametrize("kind", ["twin", "lookalike"])
def test_a_clean_project_with_a_warning_is_a_false_positive(tmp_path, kind):
    # the judge itself: a clean project that reports DDP303 (a save on every rank) is counted wrong
    names = lint_cases.Names.draw(random.Random(3))
    files, _ = lint_cases.strip_marks(lint_cases.TEMPLATES[("DDP303", "inline")](names, random.Random(1), False))
    case = lint_cases.Case(0, "DDP303" if kind == "twin" else "-", "inline", files, None, kind)
    root = tmp_path / "p"
    lint_cases.write(root, files)
    assert not lint_cases.judge(case, root).ok
