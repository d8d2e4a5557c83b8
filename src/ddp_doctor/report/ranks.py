"""A rank in a report: the one vocabulary of its state (:class:`RankWord`) and the one builder of its entry
(:func:`rank_entry`), for every source that writes one (``run``, ``attach``, Flight Recorder, ``check``).

Each source decides the word from its own evidence (a probe's state, a stack sample, a dump, a self-test's
outcome); the words and the entry's keys (report/v1's contract, DESIGN.md) are defined here only."""
from __future__ import annotations

import enum
from typing import Any, Iterable


class RankWord(str, enum.Enum):
    """A rank's one-word state in a report."""

    # run: from the rank's published state and how its process ended (session/assemble.py)
    MISSING = "missing"          # never heard from
    LOST = "lost"                # its node's launcher went silent
    CRASHED = "crashed"          # raised
    KILLED = "killed"            # a signal other than a stop's SIGTERM
    FINISHED = "finished"
    IN_COLLECTIVE = "in_collective"
    DATA_WAIT = "data_wait"
    STOPPED = "stopped"          # by a stop's SIGTERM
    EXITED = "exited"
    RUNNING = "running"
    # attach and Flight Recorder: a stack with no Python frame, a rank that wrote no dump
    UNKNOWN = "unknown"
    NO_DUMP = "no_dump"
    # check (check/v1): the outcome of a rank's self-tests
    OK = "ok"
    HUNG = "hung"
    NOT_STARTED = "not-started"
    FAILED = "failed"
    # the live view: before a rank's first state
    STARTING = "starting"


# the words of a rank nothing is wrong with (renderers mark the others)
GOOD = frozenset({RankWord.OK, RankWord.FINISHED, RankWord.RUNNING})
# the keys every rank entry has (report/v1's contract), in this order
RANK_KEYS = ("rank", "state", "epoch", "step", "last_collective", "stack", "exit_code", "signal")


def rank_entry(rank: int, state: RankWord, *, epoch: int | None = None, step: int | None = None,
               last_collective: dict[str, Any] | None = None, stack: Iterable[dict[str, Any]] = (),
               exit_code: int | None = None, signal: str | None = None, **extra: Any) -> dict[str, Any]:
    """One rank's entry: the contract's keys first, then what the source adds (``extra``, never a contract key)."""
    clash = set(extra) & set(RANK_KEYS)
    if clash:
        raise ValueError(f"rank entry keys given as extras: {sorted(clash)}")
    return {"rank": rank, "state": RankWord(state).value, "epoch": epoch, "step": step,
            "last_collective": last_collective, "stack": list(stack), "exit_code": exit_code, "signal": signal,
            **extra}
