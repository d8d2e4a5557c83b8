"""CLI behaviour through `python -m ddp_doctor lint` / `explain` in a subprocess: formats, exit codes,
selection, noqa, configuration, bad input, --fix."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_doctor.lint import lint_paths

from .conftest import FIXTURES

SRC = str(Path(__file__).resolve().parents[2] / "src")
BROKEN = FIXTURES / "seeds" / "seed_001_broken.py"
FIXED = FIXTURES / "seeds" / "seed_001_fixed.py"

BARRIER = "import torch.distributed as dist\n\ndef f(rank):\n    if rank == 0:\n        dist.barrier()\n"


def run_sub(*args, cwd=None):
    """`python -m ddp_doctor ...` in a subprocess (the real entry point)."""
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", *map(str, args)], capture_output=True, text=True,
                       cwd=cwd, env=env, timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    return p


def run(*args, cwd=None):
    """The same CLI in-process (fast; the subprocess path is covered by run_sub tests)."""
    import contextlib
    import io
    import types

    from ddp_doctor.cli import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    try:
        if cwd:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    finally:
        os.chdir(old)
    return types.SimpleNamespace(returncode=rc, stdout=out.getvalue(), stderr=err.getvalue())


def write(tmp_path: Path, name: str, text: str) -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    return p


# ------------------------------------------------------------ exit codes ---
def test_exit_codes_clean_findings_usage_in_a_subprocess(tmp_path):
    assert run_sub("lint", FIXED).returncode == 0
    p = run_sub("lint", "--format", "json", BROKEN)
    assert p.returncode == 1 and json.loads(p.stdout)["findings"]
    assert run_sub("lint", "--select", "NOPE1", BROKEN).returncode == 2
    assert run("lint", "--format", "xml", BROKEN).returncode == 2
    assert run("lint", tmp_path / "does-not-exist.py").returncode == 2


def test_fail_on_threshold(tmp_path):
    info_only = write(tmp_path, "t.py", "import torch.distributed as dist\nfrom torch.nn.parallel import "
                      "DistributedDataParallel as DDP\nm = DDP(net, find_unused_parameters=True)\n")
    p = run("lint", "--no-config", info_only)
    assert p.returncode == 0 and "DDP405" in p.stdout  # info is reported but does not fail by default
    assert run("lint", "--no-config", "--fail-on", "info", info_only).returncode == 1


# ---------------------------------------------------------------- formats ---
def test_text_format_is_ruff_like_with_source_line_caret_and_fix():
    p = run("lint", "--no-config", BROKEN)
    lines = p.stdout.splitlines()
    first = next(l for l in lines if ": DDP" in l)
    path, line, col, rest = first.split(":", 3)
    assert path == str(BROKEN) and line.isdigit() and col.isdigit() and rest.strip().startswith("DDP")
    src_line = BROKEN.read_text().splitlines()[int(line) - 1]
    assert any(src_line.strip() in l for l in lines)
    assert any(l.strip().startswith("| ") and "^" in l for l in lines)
    assert any("= fix:" in l for l in lines)
    assert "Found" in lines[-1]


def test_json_format_matches_the_contract():
    import jsonschema
    from ddp_doctor.report import LINT_JSON_SCHEMA
    p = run("lint", "--format", "json", BROKEN)
    data = json.loads(p.stdout)
    jsonschema.validate(data, LINT_JSON_SCHEMA)
    assert data["schema"] == "ddp-doctor/lint/v1"
    assert {f["code"] for f in data["findings"]} >= {"DDP101", "DDP102", "DDP103", "DDP104"}
    f = data["findings"][0]
    assert set(f) == {"code", "name", "severity", "path", "line", "column", "end_line", "end_column",
                      "message", "fix"}


def test_sarif_output_validates_against_the_official_sarif_2_1_0_schema(tmp_path):
    import jsonschema
    schema = json.loads((Path(__file__).parent / "data" / "sarif-schema-2.1.0.json").read_text())
    bad = write(tmp_path, "bad.py", "def f(:\n")
    p = run("lint", "--format", "sarif", BROKEN, bad)
    doc = json.loads(p.stdout)
    jsonschema.Draft4Validator(schema).validate(doc)
    run_ = doc["runs"][0]
    assert doc["version"] == "2.1.0" and run_["tool"]["driver"]["name"] == "ddp-doctor"
    rule_ids = [r["id"] for r in run_["tool"]["driver"]["rules"]]
    for res in run_["results"]:
        assert rule_ids[res["ruleIndex"]] == res["ruleId"]
        assert res["level"] in ("error", "warning", "note")
        assert res["locations"][0]["physicalLocation"]["region"]["startLine"] >= 1
    assert run_["invocations"][0]["toolExecutionNotifications"][0]["message"]["text"].startswith("syntax error")


def test_github_annotations():
    p = run("lint", "--format", "github", BROKEN)
    lines = [l for l in p.stdout.splitlines() if l]
    assert lines and all(l.startswith(("::error ", "::warning ", "::notice ")) for l in lines)
    first = lines[0]
    assert f"file={BROKEN}," in first
    assert ",line=" in first and ",col=" in first and ",title=DDP" in first and "::" in first[2:]
    assert "\n" not in first


# -------------------------------------------------- select / ignore / noqa ---
def test_select_and_ignore_prefixes():
    codes = lambda res: {f.code for f in res.findings}
    everything = codes(lint_paths([BROKEN]))
    assert codes(lint_paths([BROKEN], select=["DDP1"])) == {c for c in everything if c.startswith("DDP1")}
    assert codes(lint_paths([BROKEN], ignore=["DDP1", "DDP4"])) == {c for c in everything
                                                                   if not c.startswith(("DDP1", "DDP4"))}
    p = run("lint", "--format", "json", "--select", "DDP101,DDP103", BROKEN)
    assert {f["code"] for f in json.loads(p.stdout)["findings"]} == {"DDP101", "DDP103"}


def test_noqa_bare_and_with_codes(tmp_path):
    base = lint_paths([write(tmp_path, "a.py", BARRIER)])
    assert [f.code for f in base.findings] == ["DDP201"]
    for suffix, suppressed in [("  # noqa", True), ("  # noqa: DDP201", True), ("  # noqa:DDP2", True),
                               ("  # noqa: DDP101", False), ("  # NOQA: DDP101, DDP201", True)]:
        text = BARRIER.rstrip("\n") + suffix + "\n"
        res = lint_paths([write(tmp_path, "b.py", text)])
        assert (res.findings == []) is suppressed, suffix


# ----------------------------------------------------------------- config ---
def test_pyproject_configuration(tmp_path):
    proj = tmp_path / "proj"
    write(proj, "pkg/train.py", BROKEN.read_text())
    write(proj, "legacy/old.py", BARRIER)
    write(proj, "pyproject.toml", '[tool.ddp-doctor]\nignore = ["DDP4"]\nexclude = ["legacy"]\n'
                                  'fail-on = "error"\n')
    p = run("lint", "--format", "json", ".", cwd=proj)
    data = json.loads(p.stdout)
    assert data["findings"] and not any(f["code"].startswith("DDP4") for f in data["findings"])
    assert not any("legacy" in f["path"] for f in data["findings"])
    assert p.returncode == 1  # DDP101 etc. are errors
    write(proj, "pyproject.toml", '[tool.ddp-doctor]\nselect = ["DDP102"]\nfail-on = "error"\n')
    p = run("lint", "pkg", cwd=proj)
    assert p.returncode == 0 and "DDP102" in p.stdout  # a warning, below fail-on
    write(proj, "pyproject.toml", '[tool.ddp-doctor]\nfail-on = "fatal"\n')
    assert run("lint", "pkg", cwd=proj).returncode == 2
    write(proj, "pyproject.toml", '[tool.ddp-doctor]\nselct = ["DDP1"]\n')
    assert run("lint", "pkg", cwd=proj).returncode == 2
    assert run("lint", "--no-config", "pkg", cwd=proj).returncode == 1


# -------------------------------------------------------------- bad input ---
def test_bad_input_becomes_error_entries_and_the_rest_is_still_linted(tmp_path):
    root = tmp_path / "tree"
    write(root, "good.py", BARRIER)
    write(root, "syntax.py", "import torch\ndef broken(:\n    pass\n")
    (root / "latin1.py").write_bytes(b"# coding: utf-8\nx = '\xff\xfe caf\xe9'\n")
    (root / "binary.py").write_bytes(b"\x00\x01\x02ELF\x00" * 100)
    write(root, "empty.py", "")
    write(root, ".git/hooks/pre-commit.py", BARRIER)
    write(root, "venv/pyvenv.cfg", "home = /usr\n")
    write(root, "venv/lib/site.py", BARRIER)
    write(root, "__pycache__/x.py", BARRIER)
    write(root, "notes.txt", BARRIER)
    (root / "loop").symlink_to(root, target_is_directory=True)
    (root / "sub").mkdir()
    (root / "sub" / "back").symlink_to(root / "sub", target_is_directory=True)
    # several MB, mostly data (a generated table) and comments, as such files are
    big = ("import torch.distributed as dist\n" + "# " + "-" * 78 + "\n") * 10_000 + \
        "TABLE = " + repr("0123456789abcdef" * 150_000) + "\n" + BARRIER.split("\n", 1)[1]
    write(root, "big.py", big)
    assert len(big) > 3_000_000
    p = run("lint", "--format", "json", root)
    assert p.returncode == 1
    data = json.loads(p.stdout)
    errors = {Path(e["path"]).name: e["message"] for e in data["errors"]}
    assert set(errors) == {"syntax.py", "latin1.py", "binary.py"}
    assert errors["syntax.py"].startswith("syntax error") and "line 2" in errors["syntax.py"]
    assert "binary" in errors["binary.py"] and "utf-8" in errors["latin1.py"].lower()
    flagged = sorted(Path(f["path"]).name for f in data["findings"])
    assert flagged == ["big.py", "good.py"]  # nothing from .git, venv, __pycache__, .txt, or the loops


def test_explicit_file_is_linted_whatever_its_name(tmp_path):
    script = write(tmp_path, "train_script", BARRIER)
    assert [f.code for f in lint_paths([script]).findings] == ["DDP201"]


def test_too_large_file_is_an_error_entry(tmp_path, monkeypatch):
    from ddp_doctor.lint import engine
    monkeypatch.setattr(engine, "MAX_BYTES", 1000)
    big = write(tmp_path, "big.py", "x = 1\n" * 1000)
    res = engine.lint_paths([big, write(tmp_path, "small.py", BARRIER)])
    assert [e.path for e in res.errors] == [str(big)] and "too large" in res.errors[0].message
    assert [f.code for f in res.findings] == ["DDP201"]


# ------------------------------------------------------------------- --fix ---
def test_fix_edits_only_the_flagged_range_and_relints_clean(tmp_path):
    original = (
        "import torch\nimport torch.distributed as dist\nfrom torch.utils.data import DataLoader, DistributedSampler\n"
        "dist.init_process_group('gloo')\n"
        "s = DistributedSampler(ds)\n"
        "a = DataLoader(ds, shuffle=True, sampler=s)  # keep this comment\n"
        "b = DataLoader(\n    ds,\n    shuffle=True,\n    sampler=s,\n    num_workers=2,   # two workers\n)\n"
        "c = DataLoader(ds, batch_size=4, sampler=s, num_workers=args.workers)\n"
        "for epoch in range(3):\n    s.set_epoch(epoch)\n    for x in a: pass\n    for x in b: pass\n"
        "    for x in c: pass\n"
        "ckpt = torch.load('ck.pt')\n"
        "state = torch.load(\n    'ck.pt',\n    weights_only=True,  # safe\n)\n"
    )
    path = write(tmp_path, "t.py", original)
    p = run("lint", "--fix", "--fail-on", "info", path)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "fixed DDP103" in p.stderr and "fixed DDP301" in p.stderr and "fixed DDP403" in p.stderr
    new = path.read_text()
    compile(new, str(path), "exec")
    assert lint_paths([path]).findings == []
    assert "a = DataLoader(ds, sampler=s)  # keep this comment" in new
    assert "    num_workers=2, persistent_workers=True,   # two workers\n" in new
    assert "num_workers=args.workers, persistent_workers=args.workers > 0)" in new
    assert "ckpt = torch.load('ck.pt', map_location=\"cpu\")" in new
    assert "    weights_only=True, map_location=\"cpu\",  # safe\n" in new
    # untouched lines stay byte for byte
    keep = [l for l in original.splitlines() if "DataLoader" not in l and "shuffle" not in l
            and "torch.load" not in l and "num_workers" not in l and "weights_only" not in l]
    for line in keep:
        assert line in new.splitlines()


def test_fix_leaves_crlf_files_crlf(tmp_path):
    path = tmp_path / "w.py"
    path.write_bytes(b"import torch\r\nimport torch.distributed as dist\r\ndist.init_process_group('gloo')\r\n"
                     b"x = torch.load('a.pt')\r\n")
    run("lint", "--fix", path)
    assert path.read_bytes().endswith(b"x = torch.load('a.pt', map_location=\"cpu\")\r\n")


# ---------------------------------------------------------------- explain ---
def test_explain_prints_the_page_and_lists_codes():
    p = run("explain", "DDP201")
    assert p.returncode == 0 and p.stdout.startswith("# DDP201 rank-conditional-collective")
    for section in ("## What it does", "## Why is this bad?", "## Example", "## Use instead"):
        assert section in p.stdout
    assert run("explain", "ddp101").stdout.startswith("# DDP101")
    listing = run_sub("explain")
    assert listing.returncode == 0 and all(code in listing.stdout for code in ("DDP101", "DDP406", "DDP205"))
    assert run("explain", "DDP999").returncode == 2


def test_help_exits_zero():
    p = run("lint", "--help")
    assert p.returncode == 0 and "--select" in p.stdout and "noqa" in p.stdout


# ------------------------------------------------------- never imports torch ---
def test_lint_never_imports_torch():
    code = ("import sys, ddp_doctor.lint, ddp_doctor.cli.lint, ddp_doctor.lint.fix, ddp_doctor.lint.output, "
            "ddp_doctor.lint.flake8_plugin\n"
            f"r = ddp_doctor.lint.lint_paths([{str(BROKEN)!r}])\n"
            "assert r.findings\n"
            "bad = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.') or m == 'numpy')\n"
            "print(bad)\n")
    env = dict(os.environ, PYTHONPATH=SRC)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "[]"


def test_output_file_and_clean_json(tmp_path):
    out = tmp_path / "report.json"
    p = run("lint", "--format", "json", "--output", out, FIXED)
    assert p.returncode == 0 and p.stdout == ""
    data = json.loads(out.read_text())
    assert data == {"schema": "ddp-doctor/lint/v1", "findings": [], "errors": []}


def test_github_escapes_properties_and_message(tmp_path):
    odd = write(tmp_path, "a,b:c.py", BARRIER)
    p = run("lint", "--format", "github", odd)
    line = p.stdout.strip()
    assert "file=" + str(odd).replace(":", "%3A").replace(",", "%2C") + "," in line
    assert line.count("::") == 2


def test_columns_count_characters_and_fix_works_after_non_ascii(tmp_path):
    path = write(tmp_path, "u.py", "import torch\nimport torch.distributed as dist\ndist.init_process_group('gloo')\n"
                                   "état = {'clé': torch.load('ü.pt')}\n")
    [f] = lint_paths([path]).findings
    assert (f.code, f.location.column) == ("DDP301", 16)
    assert f.location.end_column == 16 + len("torch.load('ü.pt')")
    run("lint", "--fix", path)
    assert path.read_text().endswith("état = {'clé': torch.load('ü.pt', map_location=\"cpu\")}\n")


def test_declared_encodings_and_bom_are_read(tmp_path):
    latin = tmp_path / "latin.py"
    latin.write_bytes(b"# -*- coding: latin-1 -*-\n# caf\xe9\n" + BARRIER.encode())
    bom = tmp_path / "bom.py"
    bom.write_bytes(b"\xef\xbb\xbf" + BARRIER.encode())
    res = lint_paths([latin, bom])
    assert res.errors == []
    assert sorted((Path(f.location.path).name, f.location.line) for f in res.findings) == [("bom.py", 5),
                                                                                           ("latin.py", 7)]
