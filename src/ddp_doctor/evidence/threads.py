"""Where a rank's threads stand: each thread's stack, the plain values of the main thread's user frames, and
its DataLoader workers' stacks (a probe's answer to a stack request, faulthandler's files)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ddp_doctor.evidence.records import SCHEMA, Site, _sites


@dataclass(frozen=True, slots=True)
class FrameValues:
    """Short reprs of the plain values (numbers, flags, short strings, tensor shapes) one user frame held
    when a stack was asked for: what a rank-varying condition there read (``val_loss``, ``self.rank``)."""
    site: Site
    values: tuple[tuple[str, str], ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {"site": self.site.to_json(), "values": [list(kv) for kv in self.values]}

    @classmethod
    def from_json(cls, d) -> "FrameValues":
        return cls(Site.from_json(d.get("site")) or Site("?", 0), tuple((str(k), str(v)) for k, v in d.get("values") or ()))


@dataclass(frozen=True, slots=True)
class ThreadStack:
    name: str
    main: bool
    frames: tuple[Site, ...] = ()
    values: tuple[FrameValues, ...] = ()  # the main thread's innermost user frames (a probe's answer only)

    def to_json(self) -> dict[str, Any]:
        d = {"name": self.name, "main": self.main, "frames": [f.to_json() for f in self.frames]}
        return {**d, "values": [v.to_json() for v in self.values]} if self.values else d

    @classmethod
    def from_json(cls, d) -> "ThreadStack":
        return cls(str(d.get("name")), bool(d.get("main")), _sites(d.get("frames")),
                   tuple(FrameValues.from_json(v) for v in d.get("values") or ()))


def stacks_to_json(threads) -> dict[str, Any]:
    """A probe's answer to a stack request."""
    return {"schema": SCHEMA, "threads": [t.to_json() for t in threads]}


def stacks_from_json(d) -> tuple[ThreadStack, ...]:
    return tuple(ThreadStack.from_json(t) for t in (d or {}).get("threads") or ())


@dataclass(frozen=True, slots=True)
class WorkerStack:
    """A DataLoader worker process of a rank and its stack (faulthandler).  ``frozen``: the worker is one
    thread blocked on a lock of its own process (a private futex wait without a timeout), so no thread can
    ever release it -- a lock inherited locked across ``fork()`` (``watcher.outside.frozen_forever``)."""
    pid: int
    stack: tuple[Site, ...] = ()
    frozen: bool = False

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {"pid": self.pid, "stack": [f.to_json() for f in self.stack]}
        if self.frozen:
            d["frozen"] = True
        return d

    @classmethod
    def from_json(cls, d) -> "WorkerStack":
        return cls(int(d["pid"]), _sites(d.get("stack")), bool(d.get("frozen")))
