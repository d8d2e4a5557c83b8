"""The probe: runs inside every rank, records what the rank does, publishes it to the watcher.

It only records (no formatting, no CLI).  Entry points:

- ``python -m ddp_doctor.probe [-m] SCRIPT|MODULE [ARGS...]`` — what ``ddp-doctor run``
  starts in every rank: installs the hooks, then runs the user's program as
  ``__main__`` (the user's traceback and exit code are kept).
- ``import ddp_doctor.probe.auto`` (or ``DDP_DOCTOR_PROBE=1`` with the shipped
  ``sitecustomize``) — activation inside a process some other launcher started.

The watcher's side-channel store is named by ``DDP_DOCTOR_STORE=host:port``;
without it the hooks still install (cheap) but nothing is published.
"""
from __future__ import annotations

import os
import sys

from ddp_doctor.probe.recorder import Recorder

_active: "Probe | None" = None


class Probe:
    """The installed probe of this process: recorder + publisher."""

    def __init__(self) -> None:
        from ddp_doctor.probe import hooks, lifeline

        lifeline.tie_to_launcher()
        self.rec = Recorder()
        hooks.install(self.rec)
        self.publisher = None
        addr = os.environ.get("DDP_DOCTOR_STORE")
        if not addr and int(os.environ.get("WORLD_SIZE", "1")) > 1 and os.environ.get("DDP_DOCTOR_EMBEDDED", "1") != "0":
            addr = self._embedded()
        if addr:
            from ddp_doctor.probe.publisher import Publisher

            self.publisher = Publisher(self.rec, addr)
            self.publisher.start()

    def _embedded(self) -> str | None:
        """No ddp-doctor launcher around us: rank 0 hosts the side channel and the watcher (watch.embedded)."""
        try:
            from ddp_doctor.watch import embedded

            addr = embedded.side_channel_address()
            if addr and self.rec.rank == 0:
                embedded.start_in_rank0(addr)
            if addr:
                os.environ["DDP_DOCTOR_STORE_EMBEDDED"] = "1"
            return addr
        except Exception as e:
            print(f"ddp-doctor probe: no side channel ({e!r}); recording only", file=sys.stderr)
            return None

    def record_exception(self, exc: BaseException) -> None:
        """Note the exception that ends the rank: type, message, innermost user frame, traceback."""
        try:
            from ddp_doctor.probe.recorder import _is_library

            frames = []
            tb = exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                frames.append({"path": code.co_filename, "line": tb.tb_lineno, "function": code.co_name})
                tb = tb.tb_next
            from ddp_doctor.probe.recorder import _PKG_DIR

            frames = [f for f in frames if not f["path"].startswith(_PKG_DIR) and not f["path"].endswith("runpy.py")
                      and not f["path"].startswith("<frozen")]
            user = [f for f in frames if not _is_library(f["path"])]
            self.rec.exc = {
                "type": type(exc).__name__, "module": type(exc).__module__,
                "message": str(exc)[:2000],
                "location": user[-1] if user else (frames[-1] if frames else None),
                "traceback": frames[-30:],
                "in_collective": self.rec.cur is not None,
                "collective": _cur(self.rec),
                "t": round(self.rec.now(), 3),
            }
        except Exception:
            pass

    def finish(self, exit_code: int, exc: BaseException | None = None, exit_exc: BaseException | None = None) -> None:
        """Publish the end of the rank; a failing rank waits (<= 3 s) for the watcher to snapshot the others."""
        try:
            if exc is not None:
                self.record_exception(exc)
            elif isinstance(exit_exc, SystemExit):
                self.record_exception(exit_exc)
                self.rec.exit_site = (self.rec.exc or {}).get("location")
                self.rec.exc = None
            self.rec.done = exc is None
            self.rec.exit_code = exit_code
            if self.publisher is not None:
                self.publisher.stopped.set()
                self.publisher.final(wait_ack=3.0 if exc is not None else 0.0)
        except Exception:
            pass


def _cur(rec):
    c = rec.cur or rec.failed_in
    if c is None:
        return None
    site = rec.sites[c[5]] if c[5] < len(rec.sites) else None
    return {"group": c[0], "seq": c[1], "op": c[2],
            "site": None if site is None else {"path": site[0], "line": site[1], "function": site[2]}}


def activate() -> Probe:
    """Install the probe in this process (idempotent)."""
    global _active
    if _active is None:
        _active = Probe()
    return _active
