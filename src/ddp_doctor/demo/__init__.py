"""The training scripts ``ddp-doctor demo`` runs: the seed-000 bug and its fix.

``train_buggy.py`` validates through the DDP-wrapped model on rank 0 only; its
BatchNorm buffers make every forward a collective, so rank 0's validation
forwards pair with rank 1's training collectives and the job hangs at the start
of the next epoch (the "second epoch hangs" of the seed write-up).
``train_fixed.py`` validates the unwrapped ``model.module`` instead.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path

SCRIPTS = {"buggy": "train_buggy.py", "fixed": "train_fixed.py"}


def script_path(which: str) -> Path:
    """Filesystem path of a shipped demo script (``"buggy"`` or ``"fixed"``)."""
    return Path(str(resources.files(__name__).joinpath(SCRIPTS[which])))


def script_source(which: str) -> str:
    return resources.files(__name__).joinpath(SCRIPTS[which]).read_text(encoding="utf-8")
