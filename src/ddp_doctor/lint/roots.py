"""Where a linted path's project starts: the repository around it.

``ddp-doctor lint train.py`` must give the answer ``lint .`` gives for that file: the helpers it
imports, the launcher that passes it the rank, the file that sets the device all live elsewhere in
the repository.  So a path's project root is the folder holding ``.git`` above it; without one,
the nearest folder with ``pyproject.toml`` / ``setup.py`` / ``setup.cfg``; without either, the
folder above the file's top package (the folder of a plain script).  A linted directory is its own
root (a folder of the repository linted on purpose, as the fixture projects of the tests are).
"""
from __future__ import annotations

import os
from pathlib import Path

_MAX_UP = 8  # folders climbed looking for the repository's top
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
    return package if top.name in _INSTALLED else top
