"""The side channel between ranks and the launcher(s): torch's TCPStore, JSON values.

Keys (all values JSON):

- ``master``                      (node-local store only) MASTER_ADDR/PORT, WORLD_SIZE, ...
- ``started/{rank}``              pid, local rank, group rank, host — before init_process_group
- ``hello/{rank}``                host, device, versions — after init_process_group
- ``at/{rank}``                   the test a rank has just started
- ``res/{rank}/{test}``           a rank's result of one test
- ``audit/{group_rank}``          a node's environment audit (local rank 0)
- ``done/{rank}``                 a rank ran (or skipped) every test
- ``stop``                        a rank saw a missing rank at a gate: everyone stops
- ``ack`` / ``ack/{group_rank}``  the launcher has collected everything: ranks may exit

Ranks write every key to the node-local store (hosted by the node's ``ddp-doctor check``
process, alive whatever the ranks do) and to the job-wide store (the one torch's elastic
agent hosts and exports as MASTER_ADDR/MASTER_PORT), so each launcher can judge its own
ranks even after they are gone, and every node sees every rank.

Every value goes through ``ddp_doctor.channel.SideChannel``, ``run``'s store: signed with the job's
secret (``DDP_DOCTOR_SECRET``, made by ``ddp-doctor check`` on one node), so a value someone else
wrote (a forged ``stop``, a result) is dropped like a missing one.
"""
from __future__ import annotations

import json
import time
from typing import Any

import ddp_doctor.store
from ddp_doctor.channel import SideChannel, job_secret

PREFIX = "ddp_doctor_check"


def connect(host: str, port: int, timeout_s: float = 30.0, prefix: str | None = None) -> SideChannel:
    """A signed client of a TCPStore (optionally under a prefix)."""
    import torch.distributed as dist

    client = ddp_doctor.store.tcp_client(host, int(port), timeout_s)
    return SideChannel(dist.PrefixStore(prefix, client) if prefix else client, secret=job_secret())


def host_store(timeout_s: float = 30.0) -> SideChannel:
    """The node-local store, hosted in this process on an OS-chosen port of 127.0.0.1."""
    side, _port = ddp_doctor.store.host_store(0, interface="127.0.0.1", timeout_s=timeout_s)
    return side


def job_prefix(run_id: str, restart: str | int) -> str:
    return f"{PREFIX}/{run_id}/{restart}/"


def get(store: SideChannel, key: str) -> Any | None:
    """The JSON value of ``key``, or None when it is not (yet) set, does not verify, or the store is gone."""
    try:
        if not store.check([key]):
            return None
        return json.loads(store.get(key).decode("utf-8"))
    except Exception:  # noqa: BLE001 - a store that went away (or a forged value) reads as "nothing"
        return None


def wait_for(store: SideChannel, key: str, timeout_s: float, poll_s: float = 0.05) -> bool:
    """Poll until ``key`` holds a value that verifies; False after ``timeout_s`` or when the store is gone."""
    until = time.monotonic() + timeout_s
    while time.monotonic() < until:
        try:
            if store.check([key]):
                return True
        except Exception:  # noqa: BLE001
            return False
        time.sleep(poll_s)
    return False


class Channel:
    """Writes every key (JSON, signed) to each of its stores; a store that fails is dropped, never fatal."""

    def __init__(self, *stores: SideChannel | None) -> None:
        self.stores = [s for s in stores if s is not None]

    def add(self, store: SideChannel) -> None:
        self.stores.append(store)

    def set(self, key: str, value: Any) -> None:
        data = json.dumps(value)
        for store in list(self.stores):
            try:
                store.set(key, data)
            except Exception:  # noqa: BLE001
                self.stores.remove(store)
