"""A rank never blocks on the side channel: with the watcher's store stopped (SIGSTOP: it accepts and never
answers) or black-holed, the rank's exit takes no longer than a store call's deadline."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from conftest import SCRIPTS, Blackhole, env

pytestmark = pytest.mark.scenario  # real ranks under the probe and real stores: ~11 s a case (not the fast tier)

SERVER = ("import sys, time, torch.distributed as d; s = d.TCPStore('127.0.0.1', 0, is_master=True, "
          "wait_for_workers=False); print(s.port, flush=True); time.sleep(300)")


def _client(port: int):
    import torch.distributed as dist

    return dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))


def _unread_by_server(port: int) -> int:
    """Bytes clients sent that the server listening on ``port`` has not read (Linux: /proc/net/tcp*)."""
    unread = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            local, state, queues = row.split()[1], row.split()[3], row.split()[4]
            if int(local.rsplit(":", 1)[1], 16) == port and state == "01":  # the server's end, ESTABLISHED
                unread += int(queues.split(":")[1], 16)
    return unread


def _exit_delay(tmp_path, fault: str, end: str, together: threading.Barrier) -> tuple[float, subprocess.Popen, str]:
    """Seconds between the program's end and its process's exit, under the probe, with the store in state ``fault``
    (the program is told to end once every party of ``together`` is ready: its twin ends at the same moment)."""
    go = tmp_path / f"go-{fault}-{end}"
    server = hole = None
    if fault in ("stopped", "healthy"):
        server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
        port = int(server.stdout.readline())
    else:
        hole = Blackhole()
        port = hole.port
    rank = subprocess.Popen(
        [sys.executable, "-m", "ddp_doctor.probe", str(SCRIPTS / "wait_then_exit.py")],
        env=env(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", DDP_DOCTOR_STORE=f"127.0.0.1:{port}",
                DDP_DOCTOR_SECRET="k" * 64, GO_FILE=str(go), END=end),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        assert rank.stdout.readline().strip() == "READY"
        if server is not None:
            client = _client(port)
            end_t = time.monotonic() + 30
            while not client.check(["ddpd/rank/0"]) and time.monotonic() < end_t:
                time.sleep(0.05)
            assert client.check(["ddpd/rank/0"]), "the probe never published"
            if fault == "stopped":
                os.kill(server.pid, signal.SIGSTOP)
                # the publisher's next call is stuck: its request lies unread in the stopped server's socket
                end_t = time.monotonic() + 30
                while not _unread_by_server(port) and time.monotonic() < end_t:
                    time.sleep(0.05)
                assert _unread_by_server(port), "the probe made no call to the stopped store"
        together.wait(timeout=120)
        go.touch()
        out = rank.communicate(timeout=60)[0]
        exited = time.time()
        ended = float(next(line for line in out.splitlines() if line.startswith("END ")).split()[1])
        return exited - ended, rank, out
    finally:
        if rank.poll() is None:
            rank.kill()
            rank.communicate()
        if server is not None:
            server.kill()
            server.wait()
        if hole is not None:
            hole.close()


@pytest.mark.parametrize("fault,end", [("stopped", "exit"), ("stopped", "raise"), ("blackhole", "exit")])
def test_rank_exits_at_once_when_the_store_does_not_answer(tmp_path, fault, end):
    # beside it, at the same moment, its twin with a store that answers: how long this (loaded) machine takes
    # to end such a process right now
    together = threading.Barrier(2)
    with ThreadPoolExecutor(2) as pool:
        faulty = pool.submit(_exit_delay, tmp_path, fault, end, together)
        healthy = pool.submit(_exit_delay, tmp_path, "healthy", end, together)
    (delay, rank, out), (healthy_s, twin, twin_out) = faulty.result(), healthy.result()
    assert twin.returncode == (1 if end == "raise" else 0), twin_out[-2000:]
    # one store call's deadline (2 s) at most on top of a normal exit; it used to be 15-150 s
    assert delay < healthy_s + 3.0, f"exit took {delay:.1f}s (healthy {healthy_s:.1f}s)\n{out[-2000:]}"
    assert rank.returncode == (1 if end == "raise" else 0), out[-2000:]
    if end == "raise":
        assert "the user's own error" in out
