"""The side-channel store between the ranks' probes and the watcher: torch's own TCPStore, never the user's groups.

One place for the store's address handling and for every key name, so the probe (writer), the
watcher (reader) and the session (stop / multi-node report exchange) cannot disagree about them.
Values are JSON text; their shape is :mod:`ddp_doctor.evidence` (rank states) or small dicts below.

Keys (all under ``ddpd/``):
- ``rank_key(r)``               a rank's state, every ~0.25 s: a delta (``evidence.compact.StateEncoder``)
                                against the base under ``state_base_key(rank_key(r))``; its final state and
                                the one answering a stack request are the full state (evidence wire format)
Counters (``REQ``, ``NEWS``, ``ack_key``, ``NODES``, ``REPORT_READ``) are named here, but live on the store
under a name derived from the job's secret (``channel.SideChannel.counter_key``).
- ``REQ``                       counter the watcher bumps to ask every probe for its stacks
- ``NEWS``                      counter a probe bumps after a post it was asked to make at once (a
                                collective at a new line): the watcher then looks now, even when calm
- ``stack_key(r, req)``         ``{"threads": [...]}`` answering request ``req``
- ``ack_key(attempt, r)``       the watcher's go-ahead for a failing rank to exit
- ``STOP``                      the watcher is stopping the job
- ``REPORT`` / ``REPORT_READ``  multi-node: the hosting node's report, and how many nodes took it

Several nodes (hierarchical watching): each node's ``ddp-doctor run`` hosts a store of its own for its
ranks, which post under ``local_key(local_rank)`` (as ``rank_key`` above); on the root store (node 0's,
rendezvous port + 1):
- ``NODES``                     counter: a node agent takes slot ``add(NODES, 1) - 1``
- ``node_key(n)``               node n's summary, a delta against ``node_base_key(n)`` (evidence.compact)
- ``node_base_key(n)``          node n's base summary
- ``CTL``                       the root's control message to every node (evidence.Control)
- ``detail_key(n, req)``        node n's full states answering pull ``req`` (0: its last word at the end)
- ``group_addr_key(k)``         a tree of watchers (``watcher.tree``): where node rank k hosts its group store

A group leader's store (``watcher.tree``) holds the same keys for its group (``NODES``, ``node_key``, ``CTL``,
``detail_key``): to its nodes a leader is the root.

Files in the run directory (``DDP_DOCTOR_DIR``), for what a process can no longer post: ``stack_file`` (its
faulthandler's stacks on SIGUSR1 or a fatal signal) and ``teardown_file``.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta

REQ = "ddpd/req"
NEWS = "ddpd/news"
STOP = "ddpd/stop"
REPORT = "ddpd/report"
REPORT_READ = "ddpd/report_read"
# under another launcher rank 0's process hosts the store and is about to end (its report written): a counter
# the ranks still posting read, and one they count up as they let go of the store (no call to a closed store:
# torch's client prints a C++ stack trace for each)
CLOSING = "ddpd/closing"
CLOSED = "ddpd/closed"


NODES = "ddpd/nodes"
CTL = "ddpd/ctl"


def local_key(local_rank: int) -> str:
    return f"ddpd/local/{local_rank}"


def node_key(node: int) -> str:
    return f"ddpd/node/{node}"


def node_base_key(node: int) -> str:
    return f"ddpd/node/{node}/base"


def group_addr_key(node_rank: int) -> str:
    return f"ddpd/addr/{node_rank}"


def detail_key(node: int, req: int) -> str:
    return f"ddpd/detail/{node}/{req}"


def stack_file(run_dir: str, kind: str, pid: int) -> str:
    """Where a rank's or a loader worker's faulthandler writes its stacks (``kind``: "rank" or "worker")."""
    return os.path.join(run_dir, f"{kind}-{pid}.stack")


def teardown_file(run_dir: str, pid: int) -> str:
    """The marker a rank leaves when it calls destroy_process_group() (a fatal signal after it: teardown)."""
    return os.path.join(run_dir, f"teardown-{pid}")


def rank_key(rank: int) -> str:
    return f"ddpd/rank/{rank}"


def state_base_key(key: str) -> str:
    """Where the rank posting under ``key`` keeps the base its deltas are read against."""
    return f"{key}/base"


def stack_key(rank: int, req: int) -> str:
    return f"ddpd/stack/{rank}/{req}"


def ack_key(attempt: int, rank: int) -> str:
    return f"ddpd/ack/{attempt}/{rank}"


def host_store(port: int = 0, secret: bytes | None = None, interface: str = "0.0.0.0", timeout_s: float = 30.0):
    """Host the side-channel TCPStore; returns (channel, port): values signed with ``secret``, by default the
    job's (:mod:`ddp_doctor.channel`).  ``interface``: 127.0.0.1 for a store only this node's ranks use."""
    import torch.distributed as dist

    from ddp_doctor.channel import SideChannel, job_secret

    store = dist.TCPStore(interface, port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=timeout_s))
    here = "127.0.0.1" if interface == "0.0.0.0" else interface
    return SideChannel(store, secret=secret or job_secret(), renew=lambda: tcp_client(here, store.port, timeout_s)), \
        store.port


def tcp_client(host: str, port: int, timeout_s: float = 60.0):
    """A plain TCPStore client (blocks without limit on a server that accepts and never answers:
    use it only through :class:`ddp_doctor.channel.SideChannel`)."""
    import torch.distributed as dist

    return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                         timeout=timedelta(seconds=timeout_s))


def join_store(host: str, port: int, timeout_s: float = 60.0, deadline_s: float = 2.0):
    """Join a store hosted elsewhere (the watcher's, from a probe or a follower node).  Returns at once:
    it connects in the background, every call has a deadline, and a store unreachable for
    ``timeout_s`` is given up (the caller goes on unwatched)."""
    from ddp_doctor.channel import SideChannel, job_secret

    return SideChannel(connect=lambda: tcp_client(host, port, timeout_s), secret=job_secret(),
                       deadline=deadline_s, give_up_s=timeout_s)


def reader_channel(port: int, timeout_s: float = 1.0):
    """The root's own client of the root store, for its per-poll reads: a short timeout, so a summary key
    someone deleted costs a read one second, never a hang (``multi_get`` waits for every key)."""
    from ddp_doctor.channel import SideChannel, job_secret

    return SideChannel(tcp_client("127.0.0.1", port, timeout_s), secret=job_secret(),
                       renew=lambda: tcp_client("127.0.0.1", port, timeout_s))


def split_address(address: str) -> tuple[str, int]:
    """``host:port`` -> (host, port); an empty host means this machine."""
    host, _, port = address.rpartition(":")
    return host or "127.0.0.1", int(port)


def embedded_host() -> str:
    """The host other ranks reach rank 0 on: MASTER_ADDR, else the default group's rendezvous host, else
    this machine's name."""
    import socket

    return os.environ.get("MASTER_ADDR") or _rendezvous_of_default_group()[0] or socket.gethostname()


def embedded_address() -> str | None:
    """Where rank 0 hosts the store when no ``ddp-doctor run`` is around (another launcher started the
    ranks): ``MASTER_ADDR:(MASTER_PORT+1)``, ``DDP_DOCTOR_PORT`` overrides the port.  Without MASTER_ADDR /
    MASTER_PORT (``init_method="tcp://..."``, or set by the script only later) the rendezvous of the
    default process group stands in for them once it exists; before that: None (the probe asks again
    after ``init_process_group``)."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        addr, port = _rendezvous_of_default_group()
    if not addr or not port:
        return None
    return f"{addr}:{int(os.environ.get('DDP_DOCTOR_PORT') or int(port) + 1)}"


SIDE_CHANNEL_KEY = "ddp_doctor/side_channel"  # in torch's own store: where rank 0 hosts the side channel


def default_group_store():
    """The store the default process group rendezvoused on (torch's own), or None before ``init_process_group``."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return None
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


def announce_address(group_store, address: str) -> None:
    """Rank 0: tell the other ranks, through torch's store, where it hosts the side channel (a port the OS
    picked: MASTER_PORT + 1 may be anybody's, Ray's own services among them)."""
    group_store.set(SIDE_CHANNEL_KEY, address)


def announced_address(group_store, wait_s: float) -> tuple[str, int]:
    """The side channel's address rank 0 announced; polls (a non-blocking ``check``: torch's client holds
    its lock through a blocking ``wait``) for at most ``wait_s`` s, then raises TimeoutError."""
    end = time.monotonic() + wait_s
    while not group_store.check([SIDE_CHANNEL_KEY]):
        if time.monotonic() > end:
            raise TimeoutError("rank 0 announced no side channel")
        time.sleep(0.2)
    return split_address(group_store.get(SIDE_CHANNEL_KEY).decode())


def _rendezvous_of_default_group() -> tuple[str | None, int | None]:
    """(host, port) of the TCPStore the default process group rendezvoused on, or (None, None)."""
    import sys

    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_initialized():
            return None, None
        tcp = dist.distributed_c10d._get_default_store()
        while hasattr(tcp, "underlying_store") and not hasattr(tcp, "port"):
            tcp = getattr(tcp, "_underlying_non_prefix_store", None) or tcp.underlying_store
        return tcp.host, int(tcp.port)
    except Exception:
        return None, None
