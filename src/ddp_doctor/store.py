"""The side-channel store between the ranks' probes and the watcher: torch's own TCPStore, never the user's groups.

One place for the store's address handling and for every key name, so the probe (writer), the
watcher (reader) and the session (stop / multi-node report exchange) cannot disagree about them.
Values are JSON text; their shape is :mod:`ddp_doctor.evidence` (rank states) or small dicts below.

Keys (all under ``ddpd/``):
- ``rank_key(r)``               a rank's state (evidence wire format), every ~0.25 s
- ``REQ``                       counter the watcher bumps to ask every probe for its stacks
- ``stack_key(r, req)``         ``{"threads": [...]}`` answering request ``req``
- ``exit_key(attempt, r)``      a local rank's exit status, posted by the launcher that saw it die
- ``ack_key(attempt, r)``       the watcher's go-ahead for a failing rank to exit
- ``STOP``                      the watcher is stopping the job
- ``REPORT`` / ``REPORT_READ``  multi-node: the hosting node's report, and how many nodes took it
"""
from __future__ import annotations

import os
from datetime import timedelta

REQ = "ddpd/req"
STOP = "ddpd/stop"
REPORT = "ddpd/report"
REPORT_READ = "ddpd/report_read"


def rank_key(rank: int) -> str:
    return f"ddpd/rank/{rank}"


def stack_key(rank: int, req: int) -> str:
    return f"ddpd/stack/{rank}/{req}"


def exit_key(attempt: int, rank: int) -> str:
    return f"ddpd/exit/{attempt}/{rank}"


def ack_key(attempt: int, rank: int) -> str:
    return f"ddpd/ack/{attempt}/{rank}"


def host_store(port: int = 0):
    """Host the side-channel TCPStore; returns (store, port)."""
    import torch.distributed as dist

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    return store, store.port


def join_store(host: str, port: int, timeout_s: float = 60.0):
    """Connect to a store hosted elsewhere (the watcher's, from a probe or a follower node)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); an empty host means this machine."""
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


def embedded_address() -> str | None:
    """Where rank 0 hosts the store when no ``ddp-doctor run`` is around (another launcher started the
    ranks): ``MASTER_ADDR:(MASTER_PORT+1)``, ``DDP_DOCTOR_PORT`` overrides the port."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    return f"{addr}:{int(os.environ.get('DDP_DOCTOR_PORT') or int(port) + 1)}"
