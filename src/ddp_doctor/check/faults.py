"""Fault injection for ``check``'s own tests: real exits, delays, corrupted results, tiny shm.

Read only when ``DDP_DOCTOR_CHECK_FAULT`` is set (never in normal use).  Several faults
are separated by ``;``; each is ``KIND:key=value:key=value``::

    exit:rank=1:test=all_reduce        rank 1 exits (code 3, or code=N) when all_reduce starts
    delay:rank=2:test=ring             rank 2 sleeps (secs=S, default 3600) before ring
    wrong:rank=1:test=all_reduce       rank 1's received data is corrupted
    drop:pair=1-2:test=pairs           ranks 1 and 2 never send to each other
    shm:bytes=1000000                  the audit sees /dev/shm with this many free bytes

``test=rendezvous`` makes ``exit``/``delay`` happen before ``init_process_group``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

ENV_VAR = "DDP_DOCTOR_CHECK_FAULT"
KINDS = ("exit", "delay", "wrong", "drop", "shm")


@dataclass
class Fault:
    kind: str
    params: dict[str, str] = field(default_factory=dict)

    def applies(self, rank: int, test: str) -> bool:
        if self.params.get("test", test) != test:
            return False
        if "rank" in self.params:
            return int(self.params["rank"]) == rank
        if "pair" in self.params:
            return rank in self.pair()
        return True

    def pair(self) -> tuple[int, int]:
        a, b = self.params["pair"].split("-")
        return int(a), int(b)


def parse(text: str | None) -> list[Fault]:
    """Parse a ``DDP_DOCTOR_CHECK_FAULT`` value; ValueError on a malformed one."""
    faults = []
    for spec in (text or "").split(";"):
        spec = spec.strip()
        if not spec:
            continue
        kind, *parts = spec.split(":")
        if kind not in KINDS:
            raise ValueError(f"{ENV_VAR}: unknown fault kind {kind!r} (one of {', '.join(KINDS)})")
        params = {}
        for part in parts:
            key, sep, value = part.partition("=")
            if not sep:
                raise ValueError(f"{ENV_VAR}: expected key=value, got {part!r}")
            params[key] = value
        faults.append(Fault(kind, params))
    return faults


def from_env(environ=None) -> list[Fault]:
    return parse((os.environ if environ is None else environ).get(ENV_VAR))


def find(faults: list[Fault], kind: str, rank: int, test: str) -> Fault | None:
    for fault in faults:
        if fault.kind == kind and fault.applies(rank, test):
            return fault
    return None
