"""Where a linted path's project starts: the repository around it.

``ddp-doctor lint train.py`` must give the answer ``lint .`` gives for that file: the helpers it
imports, the launcher that passes it the rank, the file that sets the device all live elsewhere in
the repository.  So a path's project root is the folder holding ``.git`` above it; without one,
the nearest folder with ``pyproject.toml`` / ``setup.py`` / ``setup.cfg``; without either, the
folder above the file's top package (the folder of a plain script), or, for a script in ``tools/``
that imports a package beside that folder, the folder holding it.  A linted directory is its own
root (a folder of the repository linted on purpose, as the fixture projects of the tests are).
"""
from __future__ import annotations

import os
import re
import stat
import sys
from pathlib import Path

_MAX_UP = 8  # folders climbed looking for the repository's top
_MAX_SCRIPT_UP = 2  # folders climbed from a plain script to the package it imports (tools/, scripts/train/)
_PROJECT_FILES = ("pyproject.toml", "setup.py", "setup.cfg")
_INSTALLED = ("site-packages", "dist-packages")


def project_root(path: Path) -> Path:
    """The project root of a linted file (see the module's docstring); a directory is its own."""
    start = Path(os.path.realpath(path))
    if start.is_dir():
        return start
    here = start.parent
    project_file = None
    d = here
    for _ in range(_MAX_UP):
        if d.name in _INSTALLED:
            break  # an installed package is not part of anyone's repository
        if (d / ".git").exists():
            return d
        if project_file is None and any((d / f).is_file() for f in _PROJECT_FILES):
            project_file = d
        if d.parent == d:
            break
        d = d.parent
    if project_file is not None:
        return project_file
    top, package = here, here
    while (top / "__init__.py").is_file() and top.parent != top:
        package, top = top, top.parent
    if top.name in _INSTALLED:
        return package
    return _importing_root(start, top)


_IMPORT_RE = re.compile(r"^\s*(?:from\s+([A-Za-z_]\w*)[\w.]*\s+import|import\s+([A-Za-z_]\w*))", re.M)


def _importing_root(path: Path, top: Path) -> Path:
    """A script in ``tools/`` importing ``core.engine`` (run from the folder above, as its README says):
    the project starts at the nearest folder above ``top`` that holds a module or package the script
    imports and ``top`` does not."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):
            return top  # a FIFO or a device: never opened here (the engine reports it)
        with open(path, "rb") as f:
            text = f.read(65536).decode("utf-8", errors="replace")
    except OSError:
        return top
    names = {a or b for a, b in _IMPORT_RE.findall(text)}
    missing = [n for n in names if n not in sys.stdlib_module_names and not (top / n).is_dir() and
               not (top / f"{n}.py").is_file()]
    d = top
    for _ in range(_MAX_SCRIPT_UP):
        if d.parent == d or d.parent.name in _INSTALLED:
            break
        d = d.parent
        if any((d / n / "__init__.py").is_file() or (d / f"{n}.py").is_file() for n in missing):
            return d
    return top
