"""The arrows of docs/architecture.md point one way: a module may import only the layers below it."""
from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "ddp_doctor"

# package -> ddp_doctor packages/modules it must never import (directly or lazily)
FORBIDDEN = {
    "evidence": {"probe", "watcher", "diagnose", "session", "report", "cli", "lint", "check", "store"},
    "frames": {"probe", "watcher", "diagnose", "session", "report", "cli", "evidence"},
    "findings": {"probe", "watcher", "diagnose", "session", "report", "cli", "evidence", "lint"},
    "store": {"probe", "watcher", "diagnose", "session", "report", "cli", "evidence"},
    "probe": {"watcher", "diagnose", "session", "report", "cli", "lint"},
    "watcher": {"session", "cli", "report", "probe", "lint"},
    "diagnose": {"watcher", "session", "cli", "report", "probe"},
    "report": {"watcher", "session", "cli", "probe", "diagnose"},
    "session": {"cli"},
    # attach and Flight Recorder read a job from outside it: like the session, above report and diagnosis
    "attach": {"probe", "watcher", "session", "cli"},
    "flightrec": {"probe", "watcher", "session", "cli"},
    # check runs its own tests through torch's launcher; it shares run's signed store, not its diagnosis
    "check": {"probe", "watcher", "session", "cli", "diagnose", "attach", "flightrec", "lint"},
    "channel": {"probe", "watcher", "diagnose", "session", "report", "cli", "evidence", "lint"},
    # (lint takes its JSON schema id from report/, where every schema of ddp-doctor is defined)
    "lint": {"probe", "watcher", "diagnose", "session", "cli", "evidence", "check", "store"},
    "fixes": {"probe", "watcher", "diagnose", "session", "report", "cli", "evidence", "lint", "check", "store"},
}
# the rank program's entry wires the embedded watcher in (probe/__main__.py); nothing else may
ENTRY_POINTS = {SRC / "probe" / "__main__.py"}


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddp_doctor"):
            parts = node.module.split(".")
            if len(parts) > 1:
                out.add(parts[1])
            else:
                out |= {a.name for a in node.names}
        elif isinstance(node, ast.Import):
            out |= {a.name.split(".")[1] for a in node.names if a.name.startswith("ddp_doctor.")}
    return out


def test_no_upward_imports():
    bad = []
    for layer, forbidden in FORBIDDEN.items():
        paths = [SRC / f"{layer}.py"] if (SRC / f"{layer}.py").exists() else sorted((SRC / layer).rglob("*.py"))
        assert paths, layer
        for p in paths:
            if p in ENTRY_POINTS:
                continue
            hit = _imports(p) & forbidden
            if hit:
                bad.append(f"{p.relative_to(SRC)} imports {sorted(hit)}")
    assert not bad, bad


def test_no_module_over_500_lines():
    big = [f"{p.relative_to(SRC)}: {n}" for p in SRC.rglob("*.py")
           if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500]
    assert not big, big


# -- one core: the stacks attach, Flight Recorder and run once had each must not grow back (issue 27) ------------
POLICY = SRC / "diagnose" / "blame.py"  # the odd rank out and lint matching, for every evidence source
LINTERS = {"lint", "cli", "session"}     # who may run lint itself (attach / Flight Recorder ask blame.py)


def _sources():
    for p in sorted(SRC.rglob("*.py")):
        yield p, p.read_text(encoding="utf-8")


def test_one_policy_for_the_odd_rank_out():
    """No second "odd rank out": no majority vote, no _mismatch, no lint run or lint rule of its own outside the
    policy (the live desync path once had one: lint_subset)."""
    bad = []
    for p, text in _sources():
        if p == POLICY:
            continue
        tree = ast.parse(text)
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef) and node.name in ("_mismatch", "_lint_code", "_lint_flags", "_flag",
                                                                   "odd_ones_out", "blame_calls", "lint_mark",
                                                                   "lint_subset", "_by_lint"):
                bad.append(f"{p.relative_to(SRC)}: def {node.name}")
            if isinstance(node, ast.Attribute) and node.attr == "most_common":
                bad.append(f"{p.relative_to(SRC)}: most_common (a majority vote)")
            if isinstance(node, ast.Name) and node.id == "lint_paths" and p.relative_to(SRC).parts[0] not in LINTERS:
                bad.append(f"{p.relative_to(SRC)}: runs lint itself")
    assert not bad, bad



def test_the_history_rules_are_asked_in_one_order():
    """What the probe's history says of the odd rank out (an API entered once more than the others, ranks that
    went alone into one) is asked by the policy alone, so a mismatch, gloo's abort and a hang get one order;
    where the ranks parted before it showed (``api_parting``, ``from_parted``) is asked through
    ``collectives.parted_first`` alone, whichever way it showed (the desync and abort paths once asked them in
    two different orders of their own)."""
    owners = {"more_often": {POLICY}, "went_alone": {POLICY},
              "api_parting": {SRC / "diagnose" / "collectives.py"}, "from_parted": {SRC / "diagnose" / "collectives.py"}}
    bad = []
    for p, text in _sources():
        for name in _called(ast.parse(text)) & set(owners):
            if p not in owners[name]:
                bad.append(f"{p.relative_to(SRC)}: asks {name}")
    coll = ast.parse((SRC / "diagnose" / "collectives.py").read_text(encoding="utf-8"))
    for fn in (n for n in ast.walk(coll) if isinstance(n, ast.FunctionDef) and n.name != "parted_first"):
        for name in _called(fn) & {"_api_parted", "from_parted"}:
            bad.append(f"collectives.{fn.name} asks {name} outside parted_first")
    assert not bad, bad

# -- one judge of a stuck job (issue 35): run's probe states, attach's samples and Flight Recorder's dumps each hand
# their evidence to diagnose/stuck.py through a small EvidenceSource class of their own ----------------------------
JUDGE = SRC / "diagnose" / "stuck.py"
HANG_SOURCES = (SRC / "diagnose" / "hang.py", SRC / "attach" / "assess.py", SRC / "flightrec.py")
JUDGES_TOOLS = {"blame_calls", "lint_code_at", "agreement", "odd_ones_out"}  # the judge asks them, not the sources
SOURCE_METHODS = {"standings", "history", "lint"}  # diagnose.stuck.EvidenceSource


def _called(tree: ast.AST) -> set[str]:
    return {n.func.id if isinstance(n.func, ast.Name) else n.func.attr for n in ast.walk(tree)
            if isinstance(n, ast.Call) and isinstance(n.func, (ast.Name, ast.Attribute))}


def test_the_hang_decision_is_made_in_one_place():
    """Who is the culprit of a stuck job (outside ranks stall or the waiting ones are alone, different
    collectives, a rank gone, the transport) is decided by ``diagnose.stuck.judge`` alone: each source calls it
    with an EvidenceSource class of its own and none asks the odd-rank-out policy itself."""
    bad = []
    for p in HANG_SOURCES:
        tree = ast.parse(p.read_text(encoding="utf-8"))
        called = _called(tree)
        if "judge" not in called:
            bad.append(f"{p.relative_to(SRC)}: never asks diagnose.stuck.judge")
        bad += [f"{p.relative_to(SRC)}: calls {t} (the judge's to ask)" for t in sorted(called & JUDGES_TOOLS)]
        sources = [c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef)
                   and SOURCE_METHODS <= {f.name for f in c.body if isinstance(f, ast.FunctionDef)}]
        if len(sources) != 1:
            bad.append(f"{p.relative_to(SRC)}: {len(sources)} EvidenceSource classes, not one")
    for p, text in _sources():
        if p != JUDGE and "Standing(" in text and p not in HANG_SOURCES:
            bad.append(f"{p.relative_to(SRC)}: builds the judge's standings outside a source")
    assert not bad, bad


def test_one_store():
    """Every TCPStore of ddp-doctor is made in store.py and read through channel.SideChannel (signed)."""
    bad = [str(p.relative_to(SRC)) for p, text in _sources() if "TCPStore(" in text and p != SRC / "store.py"]
    assert not bad, bad


def test_report_v1_is_built_in_report_only():
    bad = [str(p.relative_to(SRC)) for p, text in _sources()
           if "ddp-doctor/report/v1\"" in text and p.relative_to(SRC).parts[0] != "report"]
    assert not bad, bad


def test_fix_texts_come_from_the_catalogue():
    """A runtime finding's fix (Finding's third argument) is never a string written where the finding is made."""
    bad = []
    for p, text in _sources():
        if p.relative_to(SRC).parts[0] in ("lint", "findings.py"):
            continue
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Finding", "_finding") \
                    and len(node.args) >= 3:
                fix = node.args[2]
                if isinstance(fix, ast.JoinedStr) or (isinstance(fix, ast.Constant) and isinstance(fix.value, str)):
                    bad.append(f"{p.relative_to(SRC)}:{node.lineno}")
    assert not bad, bad


def test_no_class_name_for_two_things():
    seen: dict[str, list[str]] = {}
    for p, text in _sources():
        for node in ast.parse(text).body:
            if isinstance(node, ast.ClassDef):
                seen.setdefault(node.name, []).append(str(p.relative_to(SRC)))
    twice = {k: v for k, v in seen.items() if len(v) > 1}
    assert not twice, twice


def test_architecture_names_every_package():
    doc = (SRC.parents[1] / "docs" / "architecture.md").read_text(encoding="utf-8")
    names = [p.name + "/" for p in SRC.iterdir() if p.is_dir() and (p / "__init__.py").exists()]
    names += [p.name for p in SRC.glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    missing = [n for n in names if n not in doc]
    assert not missing, missing


def test_what_a_rank_imports_to_be_watched_is_light():
    """The probe, ``watch()`` and the watcher rank 0 runs under it (with the live judge it asks every poll)
    load no lint, report or diagnosis module: those load only when a job is diagnosed or linted."""
    import json
    import subprocess
    import sys

    code = ("import json, sys; import ddp_doctor.probe, ddp_doctor.probe.__main__, ddp_doctor.watcher, "
            "ddp_doctor.diagnose.live; print(json.dumps(sorted(m for m in sys.modules if m.startswith('ddp_doctor'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    heavy = [m for m in loaded if m.startswith(("ddp_doctor.lint", "ddp_doctor.report", "ddp_doctor.session",
                                                "ddp_doctor.diagnose.core", "ddp_doctor.diagnose.provenance"))]
    assert not heavy, heavy
    assert len(loaded) <= 30, loaded  # 24 today


# -- one place per concept (issue 35): a second copy of a table is how two views of one job came to disagree --------
ONE_PLACE = {
    "a table of torch's collective functions": SRC / "evidence" / "ops.py",
    "a severity order": SRC / "findings.py",
    "a code family": SRC / "findings.py",
    "a rank's report entry": SRC / "report" / "ranks.py",
}


def _copies_in(tree: ast.AST) -> set[str]:
    from ddp_doctor.evidence import ops

    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Set, ast.Tuple, ast.List)):
            words = {e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)}
            if len(words & ops.ALL) >= 10:
                found.add("a table of torch's collective functions")
            if len(words & {"DDP101", "DDP201", "DDP202", "DDP203", "DDP204"}) >= 4:
                found.add("a code family")
        if isinstance(node, ast.Dict):
            keyed = {k.value: v for k, v in zip(node.keys, node.values) if isinstance(k, ast.Constant)}
            if set(keyed) >= {"error", "warning", "info"} and all(
                    isinstance(v, ast.Constant) and isinstance(v.value, int) for v in node.values):
                found.add("a severity order")
            if set(keyed) >= {"rank", "state", "last_collective", "exit_code"} and not isinstance(keyed["rank"], ast.Dict):
                # (report/v1's JSON schema names the keys too: its values are schemas)
                found.add("a rank's report entry")
    return found


def test_one_place_per_concept():
    """The op table, the severity order, the step family and the rank entry are each written once (lint's own
    static names of APIs aside); everyone else imports them."""
    bad = []
    for p, text in _sources():
        if p.relative_to(SRC).parts[0] == "lint":
            continue
        bad += [f"{p.relative_to(SRC)}: {what}" for what in _copies_in(ast.parse(text)) if ONE_PLACE[what] != p]
    assert not bad, bad


# -- no import circles (issue 35): an import inside a function counts (it runs when called, and a circle of
# lazy imports is a layering no one decided) --------------------------------------------------------------
# What is left: lint's own modules (analysis <-> its rules), and ``watch()`` at the package's top, which the
# probe's arming calls back (a Ray worker's training function).  A new circle, or one that grows past these
# modules, fails.
LEFT_CIRCLES = {"lint": lambda m: m.startswith("ddp_doctor.lint."),
                "watch": lambda m: m in ("ddp_doctor", "ddp_doctor.probe.__main__", "ddp_doctor.probe.arm")}


def _module_graph() -> dict[str, set[str]]:
    def name(p: Path) -> str:
        parts = list(p.relative_to(SRC.parent).with_suffix("").parts)
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)

    mods = {name(p): p for p in SRC.rglob("*.py")}
    graph = {}
    for m, p in mods.items():
        out = set()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("ddp_doctor"):
                out |= {f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in mods else node.module
                        for a in node.names}
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name in mods}
        graph[m] = {t for t in out if t in mods and t != m}
    return graph


def _circles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = set()
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.add(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(comp)
    return out


def test_no_import_circles():
    found = _circles(_module_graph())
    bad = [sorted(c) for c in found if not any(all(left(m) for m in c) for left in LEFT_CIRCLES.values())]
    assert not bad, bad


def test_the_circle_finder_finds_a_lazy_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [{"a", "b", "c"}]
    assert _circles({"a": {"b"}, "b": set()}) == []
