"""Stopping what ddp-doctor started (ranks, their DataLoader workers): SIGTERM, then SIGKILL — no orphans.

One place for `run` and `check`; only ever touches descendants of this process.
"""
from __future__ import annotations

from typing import Any


def descendants() -> list[Any]:
    """Every process this one started, recursively (psutil.Process objects); [] if that cannot be read."""
    import psutil

    try:
        return psutil.Process().children(recursive=True)
    except psutil.Error:
        return []


def terminate(procs: list[Any], grace_s: float, kill_wait_s: float = 2.0) -> dict[int, str]:
    """SIGTERM each process, SIGKILL those still running after ``grace_s``.

    Returns ``{pid: how}`` with how = "gone" (had already exited), "SIGTERM", "SIGKILL", or "alive"
    (survived even SIGKILL for ``kill_wait_s``: a leftover to report).
    """
    import psutil

    how: dict[int, str] = {}
    for p in procs:
        try:
            p.terminate()
            how[p.pid] = "SIGTERM"
        except psutil.Error:
            how[p.pid] = "gone"
    _gone, alive = psutil.wait_procs([p for p in procs if how[p.pid] == "SIGTERM"], timeout=grace_s)
    for p in alive:
        try:
            p.kill()
            how[p.pid] = "SIGKILL"
        except psutil.Error:
            pass
    _gone, alive = psutil.wait_procs(alive, timeout=kill_wait_s)
    for p in alive:
        how[p.pid] = "alive"
    return how
