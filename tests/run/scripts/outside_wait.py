"""After a few DDP steps rank 0 waits on a peer outside the job while rank 1 waits at a barrier.

``python outside_wait.py MODE`` (torchrun; ``OUTSIDE_WAIT_S``, default 20 s, is how long the peer takes):

- ``slow_reply``: rank 0 asks a local service for a checkpoint id; the service replies after the wait;
- ``no_reply``: the same service never replies (the failing twin);
- ``upload``: rank 0 uploads 16 MB through one ``sendall`` to a service that reads at a throttled rate and
  acknowledges at the end (its send queue drains: a sign of life);
- ``child``: rank 0 runs a converter, ``subprocess.run(["sleep", WAIT])``;
- ``child_forever``: the converter never exits (the failing twin);
- ``file_later``: rank 0 polls with ``time.sleep`` for a file rank 1 writes after the wait, then both meet;
- ``fifo_slow``: rank 0 reads a FIFO a local feeder writes only after the wait.

The correct modes run to exit 0 under plain torchrun (gloo's timeout: ``DDP_TIMEOUT``, default 90 s); the
failing twins wait until the process group's timeout fails rank 1's barrier.  The service and the feeder are
threads of rank 0 (outside its training thread: they answer, or not, whatever the training thread does).
"""
import datetime
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WAIT_S = float(os.environ.get("OUTSIDE_WAIT_S", 20))
MODE = sys.argv[1] if len(sys.argv) > 1 else "slow_reply"


def serve(mode: str) -> int:
    """A local service on its own thread: answers a request after WAIT_S (never, for no_reply), or reads an
    upload at a throttled rate and acknowledges at its end."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)

    def run():
        conn, _ = srv.accept()
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        if mode == "upload":
            got, size = 0, int.from_bytes(conn.recv(8), "big")
            chunk = max(1, int(size / WAIT_S / 20))
            while got < size:
                got += len(conn.recv(min(chunk, size - got)))
                time.sleep(0.05)
            conn.sendall(b"ok")
        else:
            conn.recv(64)
            time.sleep(WAIT_S if mode == "slow_reply" else 10 * WAIT_S + 3600)
            conn.sendall(b"ckpt-42")
        conn.close()

    threading.Thread(target=run, daemon=True).start()
    return srv.getsockname()[1]


def ask_service(port: int) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(b"which checkpoint?")
        return s.recv(64)  # expect: DDP205


def upload(port: int, blob: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
        s.sendall(len(blob).to_bytes(8, "big") + blob)  # one long call: no CPU, no byte count moving
        return s.recv(2)


def convert(seconds: float) -> int:
    return subprocess.run(["sleep", str(seconds)]).returncode  # expect: DDP205


def wait_for_file(path: str) -> None:
    while not os.path.exists(path):
        time.sleep(1.0)


def read_fifo(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def outside_wait(rank: int, shared: str) -> None:
    if MODE in ("slow_reply", "no_reply"):
        port = serve(MODE) if rank == 0 else 0
        if rank == 0:
            print(f"rank 0: service says {ask_service(port)!r}", flush=True)
    elif MODE == "upload" and rank == 0:
        print(f"rank 0: upload {upload(serve('upload'), os.urandom(16 << 20))!r}", flush=True)
    elif MODE in ("child", "child_forever") and rank == 0:
        convert(WAIT_S if MODE == "child" else 10 * WAIT_S + 3600)
    elif MODE == "file_later":
        flag = os.path.join(shared, "exported")
        if rank == 0:
            wait_for_file(flag)
        else:
            time.sleep(WAIT_S)
            open(flag, "w").close()
    elif MODE == "fifo_slow" and rank == 0:
        fifo = os.path.join(tempfile.mkdtemp(), "feed")
        os.mkfifo(fifo)

        def feed():
            time.sleep(WAIT_S)
            with open(fifo, "wb") as f:
                f.write(b"records")
        threading.Thread(target=feed, daemon=True).start()
        read_fifo(fifo)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
    shared = [tempfile.mkdtemp() if rank == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    outside_wait(rank, shared[0])
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
