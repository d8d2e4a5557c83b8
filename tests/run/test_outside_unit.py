"""watcher/outside.py on real processes (no torch): what a blocked thread waits on, read from /proc; and the one
fact that makes a stall a stop, a process frozen on a lock no thread of it can release (with correct twins:
a lock wait with a timeout, a second thread that will release it)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import pytest

from ddp_doctor.diagnose.live import stall_proof
from ddp_doctor.evidence import DataWait, JobEvidence, LoaderState, RankState, Verdict, WorkerStack
from ddp_doctor.watcher.outside import blocked_on, frozen_forever, queues


def _child(code: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code])


def _poll(fn, timeout: float = 10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = fn()
        if got:
            return got
        time.sleep(0.05)
    return fn()


@pytest.fixture
def server():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    yield srv
    srv.close()


def _kill(p: subprocess.Popen) -> None:
    p.kill()
    p.wait()


def test_a_recv_names_the_peer_address_and_queues(server):
    port = server.getsockname()[1]
    p = _child(f"import socket; s = socket.create_connection(('127.0.0.1', {port})); s.recv(10)")
    conn, _ = server.accept()
    try:
        o = _poll(lambda: (x := blocked_on(p.pid, None)) and x.kind == "socket" and x)
        assert o.call == "recvfrom" and o.remote == f"127.0.0.1:{port}" and o.send_queue == 0 and o.recv_queue == 0
        assert o.peer() == f"127.0.0.1:{port}" and queues(p.pid, None)[:3] == (o.fd, 0, 0)
    finally:
        conn.close()
        _kill(p)


def test_a_send_the_peer_drains_moves_a_send_the_peer_leaves_does_not(server):
    """One long sendall: the send queue stays full either way; the thread woken to refill it is the sign."""
    port = server.getsockname()[1]
    p = _child(f"import socket; s = socket.create_connection(('127.0.0.1', {port})); "
               "s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 65536); s.sendall(b'x' * (16 << 20))")
    conn, _ = server.accept()
    try:
        def settled():  # the send buffer filled: two looks 0.3 s apart agree
            a = queues(p.pid, None)
            time.sleep(0.3)
            return a is not None and a[1] > 0 and a == queues(p.pid, None) and a
        first = _poll(settled)
        time.sleep(0.6)
        assert queues(p.pid, None) == first  # nobody reads: nothing moves
        conn.recv(1 << 20)
        moved = _poll(lambda: queues(p.pid, None) != first, 3.0)
        assert moved
    finally:
        conn.close()
        _kill(p)


def test_a_recv_with_a_timeout_polls_and_still_names_the_peer(server):
    port = server.getsockname()[1]
    p = _child(f"import socket; s = socket.create_connection(('127.0.0.1', {port})); s.settimeout(60); s.recv(10)")
    conn, _ = server.accept()
    try:
        o = _poll(lambda: (x := blocked_on(p.pid, None)) and x.call == "poll" and x)
        assert o.kind == "socket" and o.remote == f"127.0.0.1:{port}"
    finally:
        conn.close()
        _kill(p)


def test_a_child_process_and_its_command_line():
    p = _child("import subprocess; subprocess.run(['sleep', '60'])")
    try:
        o = _poll(lambda: (x := blocked_on(p.pid, None)) and x.kind == "child" and x.cmdline and x)
        assert o.call == "wait4" and o.cmdline == "sleep 60" and "sleep 60" in o.peer()
    finally:
        for c in _children(p.pid):
            os.kill(c, 9)
        _kill(p)


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def test_opening_a_fifo_names_it_and_its_mount(tmp_path):
    fifo = tmp_path / "feed"
    os.mkfifo(fifo)
    p = _child(f"open({str(fifo)!r}, 'rb').read()")
    try:
        o = _poll(lambda: (x := blocked_on(p.pid, None)) and x.kind == "fifo" and x)
        assert o.call == "openat" and o.path == str(fifo) and o.mount and " at /" in o.mount
    finally:
        _kill(p)


FROZEN = """
import os, threading, time
lock = threading.Lock()
threading.Thread(target=lambda: (lock.acquire(), time.sleep(60)), daemon=True).start()
time.sleep(0.2)
if os.fork() == 0:
    {child}
    os._exit(0)
time.sleep(60)
"""


def _forked(child: str) -> tuple[subprocess.Popen, int]:
    p = _child(FROZEN.replace("{child}", child))
    kid = _poll(lambda: _children(p.pid))
    assert kid, "no child forked"
    return p, kid[0]


@pytest.mark.parametrize("child, frozen", [
    ("lock.acquire()", True),                        # inherited locked, no thread left: frozen forever
    ("lock.acquire(timeout=60)", False),             # a wait with a timeout returns
    ("threading.Thread(target=lambda: (time.sleep(30), lock.release())).start(); lock.acquire()", False),
])
def test_a_lock_no_thread_of_the_process_can_release(child, frozen):
    p, kid = _forked(child)
    try:
        time.sleep(0.5)
        assert _poll(lambda: frozen_forever(kid) == frozen, 3.0), (child, frozen)
        if not frozen:
            assert not frozen_forever(kid)
    finally:
        os.kill(kid, 9)
        _kill(p)


def test_a_rank_whose_every_loader_worker_is_frozen_is_proof_one_live_worker_is_not():
    loader = LoaderState(worker_pids=(11, 12))
    d = Verdict("stalled", stalled_s=12.0, limit_s=10.0)

    def ev(frozen: tuple[bool, bool]) -> JobEvidence:
        st = RankState(rank=0, in_data_wait=DataWait(0, 12.0), loaders=(loader,),
                       workers=(WorkerStack(11, (), frozen[0]), WorkerStack(12, (), frozen[1])))
        return JobEvidence(2, {0: st, 1: RankState(rank=1)})

    v = stall_proof(ev((True, True)), d)
    assert v is not None and v.reason == "hang" and v.kind == "frozen-workers" and v.rank == 0
    assert stall_proof(ev((True, False)), d) is None


def test_reading_a_child_s_output_names_the_child():
    p = _child("import subprocess; subprocess.check_output(['sleep', '60'])")
    try:
        o = _poll(lambda: (x := blocked_on(p.pid, None)) and x.kind == "child" and x.cmdline and x)
        assert o.call in ("read", "poll") and o.cmdline == "sleep 60" and o.path.startswith("pipe:[")
    finally:
        for c in _children(p.pid):
            os.kill(c, 9)
        _kill(p)
