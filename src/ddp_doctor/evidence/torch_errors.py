"""What torch's own error messages say, read into records: the reducer's unused-parameter error of DDP,
the DataLoader's dead-worker errors, and a collective's timeout.

One place for their wording (checked against torch 2.13), shared by the probe (which names the
parameters an error refers to by index, while the model is still there) and the diagnosis (which says
in the user's words what happened and what to change).
"""
from __future__ import annotations

import re
import signal as _signal
from dataclasses import dataclass

MAX_INDICES = 64  # a model can leave thousands of parameters unused: the first ones name the module

_REDUCTION = "Expected to have finished reduction in the prior iteration"
_INDICES = re.compile(r"Parameter indices which did not receive grad for rank (\d+):\s*([\d\s]*)")
_NAMES = re.compile(r"Parameters which did not receive grad for rank (\d+):\s*([^\n]*)")


@dataclass(frozen=True, slots=True)
class UnusedParams:
    """DDP's "Expected to have finished reduction in the prior iteration" error of one rank.

    ``indices``: into DDP's list of parameters that require grad (``module.named_parameters()`` order,
    less ``parameters_to_ignore``), the first MAX_INDICES; ``more``: how many were left out; ``names``:
    what torch printed itself under TORCH_DISTRIBUTED_DEBUG=INFO/DETAIL; ``find_unused``: the rank ran
    with find_unused_parameters=True (then, torch says, an output the loss never used, or outputs it could
    not find in forward's return value); ``static_graph``: the graph changed under static_graph=True."""
    rank: int | None
    indices: tuple[int, ...] = ()
    more: int = 0
    names: tuple[str, ...] = ()
    find_unused: bool = False
    static_graph: bool = False


def unused_params(message: str | None) -> UnusedParams | None:
    """The unused-parameter error in ``message``, or None when it is another error."""
    if not message or _REDUCTION not in message:
        return None
    m = _INDICES.search(message)
    idx = [int(x) for x in m.group(2).split()] if m else []
    n = _NAMES.search(message)
    names = tuple(x.strip() for x in n.group(2).split(",") if x.strip())[:MAX_INDICES] if n else ()
    rank = int(m.group(1)) if m else (int(n.group(1)) if n else None)
    return UnusedParams(rank, tuple(idx[:MAX_INDICES]), max(0, len(idx) - MAX_INDICES), names,
                        "find_unused_parameters=True` is enabled" in message,
                        "static_graph set to True" in message)


_KILLED = re.compile(r"DataLoader worker \(pid (\d+)\) is killed by signal: ([^.\n]+)")
_EXIT_CODE = re.compile(r"DataLoader worker \(pid (\d+)\) exited unexpectedly with exit code (-?\d+)")
_EXITED = re.compile(r"DataLoader worker \(pid\(s\) ([\d, ]+)\) exited unexpectedly")


@dataclass(frozen=True, slots=True)
class WorkerDied:
    """A DataLoader worker process died under the rank: its pid(s), the signal (``SIGKILL``) or exit code.
    ``shm``: torch added its hint that the workers may be out of shared memory (SIGBUS)."""
    pids: tuple[int, ...]
    signal: str | None = None
    exit_code: int | None = None
    shm: bool = False


def signal_name(text: str) -> str | None:
    """``SIGKILL`` for strsignal's "Killed" (what the DataLoader's message prints), None if unknown."""
    for s in _signal.Signals:
        try:
            if _signal.strsignal(s) == text.strip():
                return s.name
        except ValueError:
            continue
    return None


def worker_died(message: str | None) -> WorkerDied | None:
    """The DataLoader's "worker (pid N) is killed by signal / exited unexpectedly" error, or None."""
    if not message or "DataLoader worker" not in message:
        return None
    m = _KILLED.search(message)
    if m:
        text = m.group(2).strip()
        return WorkerDied((int(m.group(1)),), signal_name(text) or text, None, "shared memory" in message)
    m = _EXIT_CODE.search(message)
    if m:
        return WorkerDied((int(m.group(1)),), None, int(m.group(2)))
    m = _EXITED.search(message)
    if m:
        return WorkerDied(tuple(int(p) for p in m.group(1).replace(",", " ").split()))
    return None


# a collective that gave up waiting: monitored_barrier ("Rank 1 failed to pass monitoredBarrier in 5000 ms"),
# gloo ("Timed out waiting 5000ms for recv operation to complete", "Socket Timeout"), NCCL's watchdog
# ("... ran for 600000 milliseconds before timing out")
_TIMED_OUT = re.compile(r"failed to pass monitoredBarrier|Timed out waiting|Socket Timeout|before timing out|"
                        r"\btimed out\b", re.I)


def collective_timed_out(message: str | None) -> bool:
    """Is this torch's error for a collective (or a barrier) that waited its timeout out?"""
    return bool(message) and bool(_TIMED_OUT.search(message))
