"""Runtime evidence -> findings.  Pure functions: no I/O, no formatting, no torch.

The only place a verdict is decided.  :mod:`~ddp_doctor.diagnose.live` decides *while* the job runs
(the watcher asks it every poll: ``reason`` hang | desync | exit); ``diagnose(evidence, decision)``
then returns ``(verdict, findings)`` from the watcher's plain-data view of every rank, ``decision``
being the live one (``None`` for a job that ended by itself).  One module per code family:
``steps`` (DDP101/102), ``collectives`` (DDP201/202/203), ``exits`` (DDP204/501, with ``errors``: torch's
errors in the user's words), ``hang`` (DDP205 and the hang dispatch), ``groups`` (DDP510), ``perf``
(DDP3xx/4xx); ``common`` holds what they share.
"""
import importlib
from typing import Any

# the package stays light to import: the live judge (``diagnose.live``, run inside rank 0 under
# ``ddp_doctor.watch()``) imports it every time, and the diagnosis (lint's model of the user's source among
# it) is loaded only when a job is diagnosed (``core``)
_CORE = ("diagnose", "diagnose_guarded", "failure_text")


def __getattr__(name: str) -> Any:
    if name in _CORE:
        return getattr(importlib.import_module(f"{__name__}.core"), name)
    try:
        return importlib.import_module(f"{__name__}.{name}")
    except ModuleNotFoundError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
