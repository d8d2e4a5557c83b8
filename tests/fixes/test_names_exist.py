"""Every cure that lint messages, explain pages and runtime diagnoses name (`ddp_doctor.fixes.X`) exists."""
import re
from pathlib import Path

import ddp_doctor.fixes as fixes

PKG = Path(fixes.__file__).resolve().parents[1]
DOCS = PKG.parents[1] / "docs"
NAME = re.compile(r"ddp_doctor\.fixes\.([A-Za-z_][A-Za-z0-9_]*)(?:\.([A-Za-z_][A-Za-z0-9_]*))?")


def test_every_named_cure_exists():
    files = [p for p in PKG.rglob("*") if p.suffix in (".py", ".md") and "fixes" not in p.parts]
    files += list(DOCS.glob("*.md")) if DOCS.exists() else []
    named = {}
    for p in files:
        for m in NAME.finditer(p.read_text(encoding="utf-8", errors="replace")):
            named.setdefault(m.group(1), set()).add(p.name)
    assert named, "no reference to ddp_doctor.fixes found at all"
    missing = {}
    for name, where in named.items():
        if name == "lightning":
            continue  # a module (optional dependency)
        if not hasattr(fixes, name):
            missing[name] = sorted(where)
    assert not missing, f"referenced but not in ddp_doctor.fixes: {missing}"
