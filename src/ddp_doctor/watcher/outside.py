"""What a rank's training thread is blocked in, read from ``/proc`` by the watcher (never by the rank).

``/proc/PID/task/TID/syscall`` names the system call a blocked thread is in and its arguments: a ``recvfrom``
on file descriptor 7, a ``wait4`` for process 1234, a ``read`` on a FIFO.  The descriptor is then looked up
(``/proc/PID/fd``): a socket's remote address and queues come from ``/proc/PID/net/tcp`` (matched by inode), a
file's mount from ``/proc/PID/mountinfo``, a child's command line from ``/proc/CHILD/cmdline``.  A ``poll``
(Python's socket calls with a timeout) names its descriptor in memory: ``/proc/PID/mem`` is read for it when
the kernel lets this process (the ranks' launcher) read it, else the call is reported without a peer.

All of it is Linux-only, best effort and cheap (a few small files), and never raises: a rank on another node,
a kernel without these files, or a permission refused gives None.  ``queues`` is the sign of life of a thread
blocked on a socket: the bytes it queued to send draining (or new bytes arriving) mean the peer is moving.
"""
from __future__ import annotations

import os
import platform
import stat
import struct
import time

from ddp_doctor.evidence import JobEvidence, OutsideWait, Stall, Verdict

# system call numbers -> name, for the calls a thread waits in (x86_64 and the generic table of aarch64)
_X86_64 = {0: "read", 1: "write", 7: "poll", 17: "pread64", 18: "pwrite64", 19: "readv", 20: "writev",
           23: "select", 35: "nanosleep", 42: "connect", 43: "accept", 44: "sendto", 45: "recvfrom",
           46: "sendmsg", 47: "recvmsg", 61: "wait4", 73: "flock", 74: "fsync", 202: "futex",
           230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid", 257: "openat", 270: "pselect6",
           271: "ppoll", 281: "epoll_pwait", 288: "accept4"}
_GENERIC = {63: "read", 64: "write", 65: "readv", 66: "writev", 67: "pread64", 68: "pwrite64", 72: "pselect6",
            73: "ppoll", 206: "sendto", 207: "recvfrom", 211: "sendmsg", 212: "recvmsg", 203: "connect",
            202: "accept", 242: "accept4", 260: "wait4", 95: "waitid", 98: "futex", 22: "epoll_pwait",
            101: "nanosleep", 115: "clock_nanosleep", 56: "openat", 32: "flock", 82: "fsync"}
_CALLS = _GENERIC if platform.machine() in ("aarch64", "arm64", "riscv64") else _X86_64
_FD_CALLS = {"read", "write", "pread64", "pwrite64", "readv", "writev", "connect", "accept", "accept4", "sendto",
             "recvfrom", "sendmsg", "recvmsg", "flock", "fsync"}
_POLL_CALLS = {"poll", "ppoll"}
QUIET_S = 2.0  # a rank quiet this long: the watcher looks at its socket's queues every poll (a sign of life)


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:
            return f.read().decode(errors="replace")
    except OSError:
        return None


def _syscall(pid: int, tid: int | None) -> tuple[str, list[int]] | None:
    """(call name, its arguments) of the thread, None when it runs (not in a call) or cannot be read."""
    raw = _read(f"/proc/{pid}/task/{tid or pid}/syscall")
    if not raw:
        return None
    parts = raw.split()
    if not parts or parts[0] in ("running", "-1"):
        return None
    try:
        nr, args = int(parts[0]), [int(x, 16) for x in parts[1:7]]
    except ValueError:
        return None
    return _CALLS.get(nr, f"syscall {nr}"), args


def _poll_fd(pid: int, ptr: int, nfds: int) -> int | None:
    """The descriptor a ``poll`` of one descriptor waits on (``struct pollfd`` in the rank's memory)."""
    if nfds != 1 or not ptr:
        return None
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            f.seek(ptr)
            fd = struct.unpack("i", f.read(4))[0]
        return fd if fd >= 0 else None
    except (OSError, ValueError, OverflowError, struct.error):
        return None


def _path_arg(pid: int, ptr: int) -> str | None:
    """The path an ``openat`` names (a C string in the rank's memory), absolute."""
    if not ptr:
        return None
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as f:
            f.seek(ptr)
            raw = f.read(4096).split(b"\0", 1)[0].decode(errors="replace")
    except (OSError, ValueError, OverflowError):
        return None
    if raw and not raw.startswith("/"):
        try:
            raw = os.path.join(os.readlink(f"/proc/{pid}/cwd"), raw)
        except OSError:
            pass
    return raw or None


def _addr(hexaddr: str) -> str:
    """``0100007F:1F90`` (``/proc/net/tcp``, host byte order per 32-bit word) -> ``127.0.0.1:8080``."""
    ip, _, port = hexaddr.partition(":")
    raw = bytes.fromhex(ip)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    if len(words) == 4:
        host = ".".join(str(b) for b in words)
    else:
        import ipaddress

        a = ipaddress.IPv6Address(words)
        host = str(a.ipv4_mapped) if a.ipv4_mapped else f"[{a}]"
    return f"{host}:{int(port, 16)}"


def _socket(pid: int, inode: str) -> dict | None:
    """The TCP socket of ``inode`` in the rank's network namespace: addresses and queues; or a unix socket."""
    for proto in ("tcp", "tcp6"):
        raw = _read(f"/proc/{pid}/net/{proto}")
        for line in (raw or "").splitlines()[1:]:
            f = line.split()
            if len(f) > 9 and f[9] == inode:
                tx, _, rx = f[4].partition(":")
                return {"proto": proto, "local": _addr(f[1]), "remote": _addr(f[2]),
                        "send_queue": int(tx, 16), "recv_queue": int(rx, 16)}
    raw = _read(f"/proc/{pid}/net/unix")
    for line in (raw or "").splitlines()[1:]:
        f = line.split()
        if len(f) > 6 and f[6] == inode:
            return {"proto": "unix", "remote": f[7] if len(f) > 7 else None}
    return None


def _mount(pid: int, path: str) -> str | None:
    """The mount holding ``path``: "nfs 10.0.0.5:/export at /mnt/data" (fs type, source, mount point)."""
    best: tuple[int, str] | None = None
    for line in (_read(f"/proc/{pid}/mountinfo") or "").splitlines():
        head, _, tail = line.partition(" - ")
        f, t = head.split(), tail.split()
        if len(f) < 5 or len(t) < 2:
            continue
        point = f[4].replace("\\040", " ")
        if (path == point or path.startswith(point.rstrip("/") + "/")) and (best is None or len(point) > best[0]):
            best = (len(point), f"{t[0]} {t[1]} at {point}")
    return best[1] if best else None


def _cmdline(pid: int) -> str | None:
    raw = _read(f"/proc/{pid}/cmdline")
    if not raw:
        return None
    text = " ".join(x for x in raw.split("\0") if x)
    return text if len(text) <= 200 else text[:197] + "..."


def _children(pid: int) -> list[int]:
    out: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else ():
        out += [int(x) for x in (_read(f"/proc/{pid}/task/{tid}/children") or "").split()]
    return out


def _pipe_peer(pid: int, target: str) -> int | None:
    """The child process (or grandchild) of ``pid`` holding the other end of the pipe ``target``."""
    todo, seen = _children(pid), set()
    while todo and len(seen) < 64:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        try:
            if any(os.readlink(f"/proc/{c}/fd/{f}") == target for f in os.listdir(f"/proc/{c}/fd")):
                return c
        except OSError:
            continue
        todo += _children(c)
    return None


def _on_fd(pid: int, call: str, fd: int, workers: frozenset[int] = frozenset()) -> OutsideWait | None:
    try:
        target = os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return OutsideWait(call, "other", fd)
    if target.startswith("socket:["):
        sock = _socket(pid, target[8:-1])
        return OutsideWait(call, "socket", fd, **(sock or {}))
    if target.startswith("pipe:["):  # a child's output (subprocess.check_output) -- or a loader worker's queue
        child = _pipe_peer(pid, target)
        if child is not None and child in workers:
            return None  # its own DataLoader worker: inside the job (the worker's stack says where)
        if child is not None:
            return OutsideWait(call, "child", fd, pid=child, cmdline=_cmdline(child), path=target)
        return OutsideWait(call, "pipe", fd, path=target)
    try:
        mode = os.stat(f"/proc/{pid}/fd/{fd}").st_mode
    except OSError:
        mode = 0
    kind = "fifo" if stat.S_ISFIFO(mode) else "file"
    return OutsideWait(call, kind, fd, path=target, mount=_mount(pid, target))


def blocked_on(pid: int, tid: int | None, workers: frozenset[int] = frozenset()) -> OutsideWait | None:
    """What the thread ``tid`` of process ``pid`` is blocked in now, and on what (None: it runs, or /proc
    cannot say).  ``workers``: the rank's DataLoader workers, not counted as a child it waits for."""
    sc = _syscall(pid, tid)
    if sc is None:
        return None
    call, args = sc
    if call in _FD_CALLS:
        return _on_fd(pid, call, args[0], workers)
    if call in _POLL_CALLS:
        fd = _poll_fd(pid, args[0], args[1])
        return _on_fd(pid, call, fd, workers) if fd is not None else OutsideWait(call, "other")
    if call in ("wait4", "waitid"):
        child = args[1] if call == "waitid" else struct.unpack("i", struct.pack("I", args[0] & 0xFFFFFFFF))[0]
        if child <= 0:  # any child: the one that is not a loader worker, when there is one
            kids = [c for c in _children(pid) if c not in workers]
            child = kids[0] if len(kids) == 1 else 0
        return OutsideWait(call, "child", pid=child or None, cmdline=_cmdline(child) if child > 0 else None)
    if call == "openat":  # opening a FIFO blocks until a writer opens it; a file on a mount that does not answer
        path = _path_arg(pid, args[1])
        if path is None:
            return OutsideWait(call, "other")
        try:
            fifo = stat.S_ISFIFO(os.stat(path).st_mode)
        except OSError:
            fifo = False
        return OutsideWait(call, "fifo" if fifo else "file", path=path, mount=_mount(pid, path))
    if call in ("nanosleep", "clock_nanosleep"):
        return OutsideWait(call, "sleep")
    if call == "futex":
        return OutsideWait(call, "lock")
    return OutsideWait(call, "other")


_FUTEX_WAITS = (0, 9)  # FUTEX_WAIT, FUTEX_WAIT_BITSET
_FUTEX_PRIVATE = 128


def frozen_forever(pid: int) -> bool:
    """Is process ``pid`` a single thread blocked in a wait on a *private* futex (one only threads of its own
    process can wake) with no timeout?  Then nothing can ever wake it: the lock it waits for was taken by a
    thread that does not exist in it (a ``threading.Lock`` held by another thread when the process was
    forked: a DataLoader worker).  Only a signal handler of its own could (none that releases a lock is
    a real program's)."""
    try:
        if len(os.listdir(f"/proc/{pid}/task")) != 1:
            return False
    except OSError:
        return False
    sc = _syscall(pid, pid)
    if sc is None or sc[0] != "futex":
        return False
    op, timeout = sc[1][1], sc[1][3]
    return (op & 127) in _FUTEX_WAITS and bool(op & _FUTEX_PRIVATE) and timeout == 0


def _switches(pid: int, tid: int | None) -> int:
    """How often the thread was put to sleep (``voluntary_ctxt_switches``): a thread blocked in one long
    ``sendall`` is woken each time the peer takes bytes and the send buffer has room again."""
    for line in (_read(f"/proc/{pid}/task/{tid or pid}/status") or "").splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            try:
                return int(line.split()[1])
            except (IndexError, ValueError):
                return 0
    return 0


def queues(pid: int, tid: int | None) -> tuple | None:
    """The state of the socket call the thread is blocked in -- (descriptor, send queue, receive queue, times
    the thread was woken) -- None when it is not blocked on a TCP socket.  Compared between looks, a change is
    a sign of life: the peer takes bytes (the send queue stays full while it drains, but the thread is woken
    to refill it) or sends some.  A peer that takes nothing leaves all four as they were."""
    o = blocked_on(pid, tid)
    if o is None or o.kind != "socket" or o.send_queue is None:
        return None
    return (o.fd, o.send_queue, o.recv_queue, _switches(pid, tid))


def stall_record(ev: JobEvidence, d: Verdict, t0: float | None) -> Stall:
    """The record of a stall (``d``: the "stalled" decision): the live ranks outside collectives (where,
    blocked on what) and the ranks that wait in a collective, as the evidence shows them at the diagnosis;
    ``t0``: the job's wall-clock start (the ranks' timelines count from it)."""
    from ddp_doctor.diagnose.common import rank_site

    live = {r: st for r, st in ev.ranks.items() if not (st.missing or st.done or st.exc or st.exit)}
    stuck = {r: st for r, st in live.items() if st.in_collective is None}
    quiet = min((st.idle_s for st in live.values() if st.idle_s is not None), default=d.stalled_s or 0.0)
    return Stall(d.limit_s or 0.0, d.stalled_s or 0.0, {r: rank_site(st) for r, st in stuck.items()},
                 {r: st.outside for r, st in stuck.items() if st.outside is not None},
                 {r: st.in_collective for r, st in live.items() if st.in_collective is not None},
                 t=None if t0 is None else round(time.time() - quiet - t0, 3))
