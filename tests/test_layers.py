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
