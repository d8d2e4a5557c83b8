"""What a rank waits on outside the job, and the stalls a job went through.

A rank whose training thread is blocked in a system call on something that is not part of the job -- a socket
to a storage service, a child process (a converter, ``gsutil``), a FIFO or a file on a network mount -- shows no
sign of life while it waits, yet nothing proves it stuck: the peer may answer.  The watcher reads from ``/proc``
what the thread is blocked in (:class:`OutsideWait`, ``watcher/outside.py``) so that a stall's diagnosis names
the peer; :class:`Stall` keeps a stall the job came out of, for the info finding of a job that ended well.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Mapping

from ddp_doctor.evidence.records import Collective, Site


@dataclass(frozen=True, slots=True)
class OutsideWait:
    """The system call a rank's training thread is blocked in, and what it waits on (read from ``/proc``).

    ``kind``: socket | child | fifo | pipe | file | sleep | lock | other.  A socket: ``remote`` / ``local``
    addresses ("127.0.0.1:4242"), ``proto`` (tcp, tcp6, unix), the bytes queued to send (``send_queue``: not
    yet acknowledged by the peer) and received but unread (``recv_queue``).  A child: ``pid`` and
    ``cmdline``.  A FIFO, pipe or file: ``path`` and the ``mount`` holding it ("nfs 10.0.0.5:/export at
    /mnt/data")."""
    call: str
    kind: str
    fd: int | None = None
    proto: str | None = None
    remote: str | None = None
    local: str | None = None
    send_queue: int | None = None
    recv_queue: int | None = None
    pid: int | None = None
    cmdline: str | None = None
    path: str | None = None
    mount: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    @classmethod
    def from_json(cls, d: Mapping[str, Any] | None) -> "OutsideWait | None":
        if not d:
            return None
        if isinstance(d, OutsideWait):
            return d
        return cls(**{f.name: d.get(f.name) for f in fields(cls) if f.name in d})

    def peer(self) -> str | None:
        """The peer in a few words ("127.0.0.1:4242", "child 1234 (sleep 600)", "/tmp/x.fifo"), None when
        there is no peer to name (a sleep, a lock, a call we cannot read)."""
        if self.kind == "socket":
            return self.remote or (f"a {self.proto} socket" if self.proto else None)
        if self.kind == "child":
            return f"child process {self.pid}" + (f" ({self.cmdline})" if self.cmdline else "")
        if self.kind in ("fifo", "file"):
            return self.path
        # (a pipe whose other end is in no child: unnamed, as a sleep or a lock)
        return None


@dataclass(frozen=True, slots=True)
class Stall:
    """A stall of the job: no rank showed a sign of life for the limit (``limit_s``).  ``stuck``: the ranks
    outside collectives, each at its innermost user line (``where``) and blocked on ``outside`` when the
    watcher could read it; ``waiting``: the ranks waiting in a collective for them.  ``lasted_s``: how long no
    rank showed a sign of life, up to the moment one did again (None while the job is still stalled).  ``t``:
    when it began, in seconds since the job's start (the ranks' timelines' clock; None when unknown)."""
    limit_s: float
    idle_s: float
    where: Mapping[int, Site | None] = field(default_factory=dict)
    outside: Mapping[int, OutsideWait] = field(default_factory=dict)
    waiting: Mapping[int, Collective] = field(default_factory=dict)
    lasted_s: float | None = None
    t: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"limit_s": self.limit_s, "idle_s": self.idle_s, "lasted_s": self.lasted_s, "t": self.t,
                "where": {str(r): None if s is None else s.to_json() for r, s in self.where.items()},
                "outside": {str(r): o.to_json() for r, o in self.outside.items()},
                "waiting": {str(r): c.to_json() for r, c in self.waiting.items()}}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> "Stall":
        return cls(float(d.get("limit_s") or 0.0), float(d.get("idle_s") or 0.0),
                   {int(r): Site.from_json(s) for r, s in (d.get("where") or {}).items()},
                   {int(r): OutsideWait.from_json(o) for r, o in (d.get("outside") or {}).items()},
                   {int(r): Collective.from_json(c) for r, c in (d.get("waiting") or {}).items()},
                   d.get("lasted_s"), d.get("t"))

    def with_(self, **kw) -> "Stall":
        return replace(self, **kw)
