"""``[tool.ddp-doctor]`` in the nearest pyproject.toml.

    [tool.ddp-doctor]
    select = ["DDP1", "DDP2"]      # code prefixes (default: all)
    ignore = ["DDP406"]
    exclude = ["legacy/*", "*_old.py"]
    fail-on = "warning"            # error | warning | info: lowest severity that makes the exit code 1
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

try:  # Python >= 3.11
    import tomllib as _toml
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    try:
        import tomli as _toml  # type: ignore[no-redef]
    except ModuleNotFoundError:
        _toml = None  # type: ignore[assignment]

SEVERITIES = ("error", "warning", "info")
DEFAULT_FAIL_ON = "warning"


class ConfigError(ValueError):
    pass


@dataclass
class Config:
    select: list[str] = field(default_factory=list)
    ignore: list[str] = field(default_factory=list)
    exclude: list[str] = field(default_factory=list)
    fail_on: str = DEFAULT_FAIL_ON
    path: str | None = None  # the pyproject.toml it came from


def find_pyproject(start: str | os.PathLike[str]) -> Path | None:
    p = Path(start).resolve()
    if p.is_file():
        p = p.parent
    for d in (p, *p.parents):
        cand = d / "pyproject.toml"
        if cand.is_file():
            return cand
    return None


def _str_list(value: Any, key: str, path: Path) -> list[str]:
    if isinstance(value, str):
        value = [v.strip() for v in value.split(",") if v.strip()]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: [tool.ddp-doctor] {key} must be a list of strings")
    return value


def load_config(paths: Sequence[str | os.PathLike[str]] = (), explicit: str | None = None) -> Config:
    """The configuration for linting ``paths`` (nearest pyproject.toml to the first path, else to the cwd)."""
    pyproject = Path(explicit) if explicit else find_pyproject(paths[0] if paths else os.getcwd())
    if pyproject is None or not pyproject.is_file():
        if explicit:
            raise ConfigError(f"{explicit}: no such config file")
        return Config()
    if _toml is None:  # pragma: no cover
        return Config()
    try:
        data = _toml.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, _toml.TOMLDecodeError) as e:
        raise ConfigError(f"{pyproject}: cannot read TOML: {e}") from None
    section = data.get("tool", {}).get("ddp-doctor")
    if section is None:
        return Config(path=str(pyproject))
    if not isinstance(section, dict):
        raise ConfigError(f"{pyproject}: [tool.ddp-doctor] must be a table")
    cfg = Config(path=str(pyproject))
    known = {"select", "ignore", "exclude", "fail-on", "fail_on", "extend-ignore", "extend-select"}
    unknown = set(section) - known
    if unknown:
        raise ConfigError(f"{pyproject}: unknown key(s) in [tool.ddp-doctor]: {', '.join(sorted(unknown))}")
    cfg.select = _str_list(section.get("select", []), "select", pyproject) + \
        _str_list(section.get("extend-select", []), "extend-select", pyproject)
    cfg.ignore = _str_list(section.get("ignore", []), "ignore", pyproject) + \
        _str_list(section.get("extend-ignore", []), "extend-ignore", pyproject)
    cfg.exclude = _str_list(section.get("exclude", []), "exclude", pyproject)
    fail_on = section.get("fail-on", section.get("fail_on", DEFAULT_FAIL_ON))
    if fail_on not in SEVERITIES:
        raise ConfigError(f"{pyproject}: fail-on must be one of {', '.join(SEVERITIES)}, not {fail_on!r}")
    cfg.fail_on = fail_on
    return cfg
