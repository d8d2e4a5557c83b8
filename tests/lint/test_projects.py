"""Fixture *projects* (issue 13): multi-file repositories linted as a whole, each a `broken/` tree with
`# expect: DDPnnn` on the hazard's line and `# related-to: DDPnnn` on the other file's line that makes
it one, and a `clean/` twin that must report nothing."""
import json
import re
from pathlib import Path

import pytest

from ddp_doctor.lint import lint_paths
from ddp_doctor.lint.output import format_sarif, format_text

from .conftest import FIXTURES

PROJECTS = FIXTURES / "projects"
NAMES = sorted(p.name for p in PROJECTS.iterdir() if p.is_dir())
RELATED = re.compile(r"#\s*related-to:\s*((?:DDP\d{3}\s*)+)")
EXPECT = re.compile(r"#\s*expect:\s*((?:DDP\d{3}\s*)+)")


def markers(root: Path, pattern: re.Pattern) -> set[tuple[str, str, int]]:
    out = set()
    for path in sorted(root.rglob("*.py")):
        for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            m = pattern.search(line)
            if m:
                for code in m.group(1).split():
                    out.add((code, path.relative_to(root).as_posix(), i))
    return out


def rel(root: Path, path: str) -> str:
    return Path(path).resolve().relative_to(root.resolve()).as_posix()


def test_there_are_fixture_projects_for_each_layout():
    assert {"detr_style", "detectron2_comm", "lightning_module", "accelerate_script", "timm_style",
            "nanogpt_style", "examples_tutorial"} <= set(NAMES)
    for name in NAMES:
        assert (PROJECTS / name / "clean").is_dir(), f"{name} has no clean twin"
        assert (PROJECTS / name / "broken").is_dir(), f"{name} has no broken tree"
        assert markers(PROJECTS / name / "broken", EXPECT), f"{name}/broken expects nothing"


@pytest.mark.parametrize("name", NAMES)
def test_broken_project_reports_exactly_the_marked_lines_with_their_related_locations(name):
    root = PROJECTS / name / "broken"
    res = lint_paths([root])
    assert res.errors == []
    got = {(f.code, rel(root, f.location.path), f.location.line) for f in res.findings}
    assert got == markers(root, EXPECT)
    want_related = markers(root, RELATED)
    got_related = {(f.code, rel(root, r["path"]), r["line"])
                   for f in res.findings for r in f.evidence.get("related", ())}
    assert got_related == want_related


@pytest.mark.parametrize("name", NAMES)
def test_clean_twin_reports_nothing(name):
    res = lint_paths([PROJECTS / name / "clean"])
    assert res.findings == [] and res.errors == []


def test_related_locations_in_text_json_and_sarif(monkeypatch):
    root = PROJECTS / "detectron2_comm" / "broken"
    monkeypatch.chdir(root)
    res = lint_paths(["."])
    f = next(f for f in res.findings if f.location.path.endswith("train_net.py"))
    assert f.evidence["related"] == [{"path": "d2proj/utils/comm.py", "line": 25,
                                      "message": "`dist.barrier()` in `synchronize`"}]
    assert "d2proj/utils/comm.py:25" in f.message  # the message names the other file:line too
    assert "= related: d2proj/utils/comm.py:25: `dist.barrier()` in `synchronize`" in format_text(res)
    data = res.to_lint_dict()
    assert any(x.get("related") == f.evidence["related"] for x in data["findings"])
    sarif = json.loads(format_sarif(res))
    locs = [r.get("relatedLocations") for r in sarif["runs"][0]["results"]]
    assert all(loc and loc[0]["physicalLocation"]["artifactLocation"]["uri"] == "d2proj/utils/comm.py" and
               loc[0]["physicalLocation"]["region"]["startLine"] == 25 for loc in locs)


def test_sarif_with_related_locations_validates_against_the_schema():
    import jsonschema
    schema = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
    res = lint_paths([PROJECTS / "detr_style" / "broken"])
    jsonschema.validate(json.loads(format_sarif(res)), schema)


BARRIER_HELPER = "import torch.distributed as dist\n\n\ndef synchronize():\n    dist.barrier()\n"


@pytest.mark.parametrize("layout", [
    # (module path of the helper, the import line in pkg/train.py, the call)
    ("pkg/utils/comm.py", "from .utils import comm", "comm.synchronize()"),
    ("pkg/utils/comm.py", "from .utils.comm import synchronize as sync", "sync()"),
    ("pkg/utils/comm.py", "import pkg.utils.comm as comm", "comm.synchronize()"),
    ("pkg/utils/comm.py", "from pkg.utils import comm", "comm.synchronize()"),
    ("pkg/utils/comm.py", "import pkg.utils.comm", "pkg.utils.comm.synchronize()"),
    ("pkg/utils/__init__.py", "from pkg.utils import synchronize", "synchronize()"),
    ("pkg/comm.py", "from . import comm", "comm.synchronize()"),
])
def test_import_forms_resolve_to_the_project_file(tmp_path, layout):
    helper, import_line, call = layout
    for d in ("pkg", "pkg/utils"):
        (tmp_path / d).mkdir(exist_ok=True)
        (tmp_path / d / "__init__.py").touch()
    (tmp_path / helper).write_text(BARRIER_HELPER)
    (tmp_path / "pkg" / "train.py").write_text(
        f"{import_line}\n\n\ndef main(rank):\n    if rank == 0:\n        {call}\n")
    res = lint_paths([tmp_path])
    assert [(f.code, Path(f.location.path).name, f.location.line) for f in res.findings] == \
        [("DDP201", "train.py", 6)]
    assert res.findings[0].evidence["related"][0]["line"] == 5


def test_a_lone_file_still_resolves_its_siblings(tmp_path):
    (tmp_path / "comm.py").write_text(BARRIER_HELPER)
    (tmp_path / "train.py").write_text(
        "import comm\n\n\ndef main(rank):\n    if rank == 0:\n        comm.synchronize()\n")
    res = lint_paths([tmp_path / "train.py"])
    assert [f.code for f in res.findings] == ["DDP201"]


def test_installed_packages_are_not_part_of_the_project(tmp_path):
    # `import torch.distributed` from a project file resolves to nothing outside the linted tree
    (tmp_path / "train.py").write_text("import torch.distributed as dist\n\n\ndef main(rank):\n"
                                       "    if rank == 0:\n        dist.barrier()\n")
    from ddp_doctor.lint.project import Project
    from ddp_doctor.lint.model import ModuleModel
    import ast
    src = (tmp_path / "train.py").read_text()
    m = ModuleModel(ast.parse(src), str(tmp_path / "train.py"), src)
    Project([tmp_path]).register(m)
    assert m.project.resolve_local(m, "dist") is None


def test_summaries_follow_the_content_of_the_other_file_not_its_name(tmp_path):
    comm = tmp_path / "comm.py"
    train = tmp_path / "train.py"
    train.write_text("import comm\n\n\ndef main(rank):\n    if rank == 0:\n        comm.synchronize()\n")
    comm.write_text(BARRIER_HELPER)
    assert [f.code for f in lint_paths([tmp_path]).findings] == ["DDP201"]
    comm.write_text("def synchronize():\n    pass  # no collective any more\n")
    assert lint_paths([tmp_path]).findings == []  # the cached summary was keyed by the old content
    comm.write_text(BARRIER_HELPER)
    assert [f.code for f in lint_paths([tmp_path]).findings] == ["DDP201"]


def test_a_summary_is_computed_once_per_content(tmp_path, monkeypatch):
    from ddp_doctor.lint import project as P

    (tmp_path / "comm.py").write_text(BARRIER_HELPER)
    for i in range(3):
        (tmp_path / f"train{i}.py").write_text(
            "import comm\n\n\ndef main(rank):\n    if rank == 0:\n        comm.synchronize()\n")
    calls = []
    real = P._summarise
    monkeypatch.setattr(P, "_SUMMARIES", {})
    monkeypatch.setattr(P, "_summarise", lambda *a: calls.append(a[2].name) or real(*a))
    res = lint_paths([tmp_path])
    assert [f.code for f in res.findings] == ["DDP201"] * 3
    assert calls == ["synchronize"]


def test_an_object_calling_itself_is_no_method_of_another_file(tmp_path):
    # `self()` has no attribute to look up in a base class (torch._dynamo calls its own instances so)
    (tmp_path / "base.py").write_text("class Base:\n    pass\n")
    (tmp_path / "engine.py").write_text(
        "import torch.distributed as dist\nfrom base import Base\n\n\nclass Engine(Base):\n"
        "    def run(self, rank):\n        if rank == 0:\n            self()\n            self.step()\n\n"
        "    def __call__(self):\n        dist.init_process_group('gloo')\n")
    res = lint_paths([tmp_path])
    assert res.errors == []
