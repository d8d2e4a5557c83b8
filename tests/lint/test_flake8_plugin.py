"""The flake8 plugin, run by flake8 itself (its plugin loading goes through the entry point).

CI installs the package (`pip install -e .`), which registers the `flake8.extension` entry point
`DDP`. Without an installed distribution, the test registers the same entry point through a
throwaway `.dist-info` directory on PYTHONPATH — the mechanism an install uses."""
import importlib.metadata as md
import os
import subprocess
import sys
from pathlib import Path

import pytest

import flake8  # noqa: E402,F401 (a test dependency: missing, it must fail loudly)

SRC = Path(__file__).resolve().parents[2] / "src"
PYPROJECT = SRC.parent / "pyproject.toml"


def _entry_point_value() -> str:
    text = PYPROJECT.read_text(encoding="utf-8")
    section = text.split('[project.entry-points."flake8.extension"]', 1)[1]
    line = next(l for l in section.splitlines() if l.strip().startswith("DDP"))
    return line.split("=", 1)[1].strip().strip('"')


def _env(tmp_path: Path) -> dict:
    paths = [str(SRC)]
    installed = any(ep.name == "DDP" and "ddp_doctor" in ep.value
                    for ep in md.entry_points(group="flake8.extension"))
    if not installed:
        info = tmp_path / "site" / "ddp_doctor_flake8_test-0.0.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ddp-doctor-flake8-test\nVersion: 0.0\n")
        (info / "entry_points.txt").write_text(f"[flake8.extension]\nDDP = {_entry_point_value()}\n")
        paths.insert(0, str(tmp_path / "site"))
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths + [os.environ.get("PYTHONPATH", "")]))


def test_flake8_reports_ddp_codes_and_honours_noqa(tmp_path):
    assert _entry_point_value() == "ddp_doctor.lint.flake8_plugin:Flake8Plugin"
    f = tmp_path / "train.py"
    f.write_text(
        "import torch.distributed as dist\n\n\n"
        "def f(rank):\n"
        "    if rank == 0:\n"
        "        dist.barrier()\n"
        "    if rank == 1:\n"
        "        dist.barrier()  # noqa: DDP201\n"
    )
    p = subprocess.run([sys.executable, "-m", "flake8", "--select", "DDP", str(f)], capture_output=True,
                       text=True, env=_env(tmp_path), timeout=120)
    assert "Traceback" not in p.stderr, p.stderr
    lines = p.stdout.splitlines()
    assert len(lines) == 1, p.stdout + p.stderr
    assert lines[0].startswith(f"{f}:6:9: DDP201 collective `dist.barrier()`")
    assert p.returncode == 1
