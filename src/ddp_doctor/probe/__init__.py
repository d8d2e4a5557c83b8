"""The probe: runs inside every rank, records what the rank does, publishes it to the watcher.

It only records (no formatting, no CLI).  Entry points:

- ``python -m ddp_doctor.probe [-m] SCRIPT|MODULE [ARGS...]`` — what ``ddp-doctor run``
  starts in every rank: installs the hooks, then runs the user's program as
  ``__main__`` (the user's traceback and exit code are kept).
  Under another launcher (plain torchrun, srun) the same entry makes rank 0 host
  the side channel and a watcher (``ddp_doctor.session.embedded``, passed in by
  ``__main__`` so that the probe itself depends only on ``store``).
- ``ddp_doctor.watch()`` — the same activation from inside the rank's program (``__main__.watch``),
  before or after ``init_process_group``; :mod:`ddp_doctor.probe.ending` sees the program end.

The watcher's side-channel store is named by ``DDP_DOCTOR_STORE=host:port``;
without it the hooks still install (cheap) but nothing is published.
"""
from __future__ import annotations

import os
import sys
from typing import Callable

from ddp_doctor.probe.recorder import Recorder

_active: "Probe | None" = None
# a failing rank under another launcher waits this long for rank 0's watcher to write the report and stop the job
EMBEDDED_REPORT_WAIT_S = 20.0
# rank 0 under another launcher: (store address, world size) -> run after the rank finished, or None
HostWatcher = Callable[[str, int], "tuple[Callable[[], None] | None, int]"]


class Probe:
    """The installed probe of this process: recorder + publisher."""

    def __init__(self, host_watcher: HostWatcher | None = None) -> None:
        from ddp_doctor.probe import groups, hooks, lifeline

        lifeline.tie_to_launcher()
        self.rec = Recorder()
        hooks.install(self.rec)
        self.publisher = None
        self.host_watcher = host_watcher
        self.finished = False
        self.after_finish: list[Callable[[], None]] = []  # rank 0's embedded watcher: the final report
        if groups.adopt(self.rec):  # activated after init_process_group (ddp_doctor.watch())
            from ddp_doctor.probe.adopt import adopt_existing

            adopt_existing()
        self.connect()
        if self.publisher is None and not os.environ.get("DDP_DOCTOR_STORE"):
            groups.after_init(self.connect)  # the store's address may only be known once the group is made

    def connect(self) -> None:
        """Join ``ddp-doctor run``'s store, or (another launcher) find or host the embedded one; a no-op once
        connected, or while neither the environment nor a process group tells where the store is."""
        if self.publisher is not None:
            return
        addr = os.environ.get("DDP_DOCTOR_STORE")
        if not addr:
            from ddp_doctor.probe import groups

            if not groups.adopt(self.rec) and "RANK" not in os.environ:
                return  # which rank this is, torch only says once the group exists
            if self.rec.world_size <= 1 or os.environ.get("DDP_DOCTOR_EMBEDDED", "1") == "0":
                return
            addr = self._embedded()
        if addr:
            from ddp_doctor.probe.publisher import Publisher

            self.publisher = Publisher(self.rec, addr)
            self.publisher.start()
            self.rec.flush = self.publisher.flush

    def _embedded(self):
        """No ddp-doctor launcher around us: rank 0 hosts the side channel and the watcher (``host_watcher``).

        Once the default group exists, rank 0 hosts on a port the OS picks and announces it in torch's own
        store (the others' publishers look it up while they connect); before that, on MASTER_PORT + 1
        (``DDP_DOCTOR_PORT`` fixes the port in both cases)."""
        try:
            from ddp_doctor import store as side

            group = side.default_group_store()
            if group is not None and not os.environ.get("DDP_DOCTOR_PORT"):
                if self.rec.rank == 0 and self.host_watcher is not None:
                    host = side.embedded_host()
                    port = self._host(f"{host}:0")
                    side.announce_address(group, f"{host}:{port}")
                    addr = f"{host}:{port}"
                else:
                    addr = lambda: side.announced_address(group, wait_s=5.0)  # noqa: E731
            else:
                addr = side.embedded_address()
                if addr and self.rec.rank == 0 and self.host_watcher is not None:
                    self._host(addr)
            if addr:
                os.environ["DDP_DOCTOR_STORE_EMBEDDED"] = "1"
            return addr
        except Exception as e:
            print(f"ddp-doctor probe: no side channel ({e!r}); recording only", file=sys.stderr)
            return None

    def _host(self, address: str) -> int:
        """Rank 0: host the store and the watcher on ``address``; returns the port it listens on."""
        final, port = self.host_watcher(address, self.rec.world_size)
        if final is not None:
            self.after_finish.append(final)
        return port

    def record_exception(self, exc: BaseException) -> None:
        """Note the exception that ends the rank: type, message, innermost user frame, traceback."""
        try:
            from ddp_doctor.evidence import RaisedError, Site
            from ddp_doctor import frames as kinds
            from ddp_doctor.probe.publisher import current_collective

            frames = []
            tb = exc.__traceback__
            while tb is not None:
                code = tb.tb_frame.f_code
                frames.append(Site(code.co_filename, tb.tb_lineno, code.co_name))
                tb = tb.tb_next
            frames = [f for f in frames if not kinds.is_tooling(f.path)]
            user = [f for f in frames if kinds.is_user(f.path)] or [f for f in frames if not kinds.is_internal(f.path)]
            self.rec.exc = RaisedError(
                type=type(exc).__name__, module=type(exc).__module__, message=str(exc)[:2000],
                location=user[-1] if user else (frames[-1] if frames else None), traceback=tuple(frames[-30:]),
                in_collective=self.rec.cur is not None, collective=current_collective(self.rec),
                t=round(self.rec.now(), 3))
        except Exception:
            pass
        try:  # an error that numbers the DDP model's parameters: name them while the model is there
            from ddp_doctor.probe.ddp_params import name_unused

            name_unused(self.rec, exc)
        except Exception:
            pass
        try:  # a DataLoader worker that died under the rank: which one, by which signal
            from ddp_doctor.probe.workers import note_dead_workers

            note_dead_workers(self.rec, exc)
        except Exception:
            pass

    def finish(self, exit_code: int, exc: BaseException | None = None, exit_exc: BaseException | None = None) -> None:
        """Publish the end of the rank (once); a failing rank waits (<= 3 s) for the watcher to snapshot the
        others; then ``after_finish`` (rank 0 hosting the watcher: the job's report)."""
        if self.finished:
            return
        self.finished = True
        try:
            if exc is not None:
                self.record_exception(exc)
            elif isinstance(exit_exc, SystemExit):
                self.record_exception(exit_exc)
                self.rec.exit_site = self.rec.exc.location if self.rec.exc is not None else None
                from ddp_doctor.frames import is_user

                self.rec.exit_stack = tuple(f for f in self.rec.exc.traceback if is_user(f.path)) \
                    if self.rec.exc is not None else ()
                self.rec.exc = None
            self.rec.done = exc is None
            self.rec.exit_code = exit_code
            if self.publisher is not None:
                self.rec.flush = None
                self.publisher.stop()
                embedded = os.environ.get("DDP_DOCTOR_STORE_EMBEDDED") == "1"
                self.publisher.final(wait_ack=3.0 if exc is not None else 0.0,
                                     wait_stop=EMBEDDED_REPORT_WAIT_S if exc is not None and embedded else 0.0)
        except Exception:
            pass
        for fn in self.after_finish:
            try:
                fn()
            except Exception as e:
                print(f"ddp-doctor probe: {e!r}", file=sys.stderr)


def active() -> "Probe | None":
    """The probe installed in this process, if any."""
    return _active


# a launcher's word that this process is one of several ranks: torch's, Open MPI's / MPICH's, an srun step's
WORLD_SIZE_ENV = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_STEP_NUM_TASKS")


def distributed() -> bool:
    """Is this process a rank of a job of several?  A launcher's environment says so before the group
    exists, an initialised default group after (Lightning's ddp_spawn sets no WORLD_SIZE).  Never imports torch."""
    for name in WORLD_SIZE_ENV:
        try:
            if int(os.environ.get(name) or 1) > 1:
                return True
        except ValueError:
            pass
    dist = sys.modules.get("torch.distributed")
    try:
        return bool(dist is not None and dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)
    except Exception:
        return False


def activate(host_watcher: HostWatcher | None = None) -> Probe:
    """Install the probe in this process (idempotent); ``host_watcher(address, world_size)`` starts the embedded
    watcher and returns (what to run once this rank finished (its final report) or None, the port it hosts on)."""
    global _active
    if _active is None:
        _active = Probe(host_watcher)
    return _active
