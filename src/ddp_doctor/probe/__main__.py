"""``python -m ddp_doctor.probe [-m] SCRIPT|MODULE [ARGS...]``: install the probe, then run the user's program as __main__.

Also :func:`watch` (``ddp_doctor.watch()``): the same activation from inside the rank's program.
The rank program's entry points, so the one place inside probe/ that wires in the session (the embedded
watcher rank 0 hosts under another launcher); the probe modules themselves depend only on ``store`` and ``evidence``.
"""
from __future__ import annotations

import os
import runpy
import sys


def _host_watcher(address: str, world_size: int):
    """Rank 0 under another launcher: host the side channel and the watcher in this process; returns (the
    job's final report, to run once this rank finished; the port the side channel listens on)."""
    from ddp_doctor.session import embedded

    return embedded.start_in_rank0(address, world_size)


def watch() -> bool:
    """Watch this rank: install the probe and join (rank 0: host) the watcher, as ``-m ddp_doctor.probe``
    does; a no-op under ``ddp-doctor run`` or ``-m ddp_doctor.probe`` (already installed) and on a second call.
    Before or after ``init_process_group``.  In a process that is not (yet) a rank of a job of several
    (Lightning's ``python train.py`` before ``Trainer.fit``, a file ``mp.spawn`` re-imports, a Ray Train
    driver) it arms itself (:mod:`ddp_doctor.probe.arm`) and activates when the process group forms.
    True when this rank is watched now."""
    from ddp_doctor.probe import active, distributed

    if active() is not None:
        return True
    if _reimported_main() or not distributed():
        from ddp_doctor.probe import arm

        if not arm.arm(_activate_with_ending):
            print("ddp-doctor: watch() has nothing to watch here: torch is not installed", file=sys.stderr)
        return False
    _activate_with_ending()
    return True


def _activate_with_ending() -> None:
    """The probe, rank 0 hosting the watcher, and the program's end seen (:mod:`ddp_doctor.probe.ending`)."""
    from ddp_doctor.probe import activate, active, ending

    if active() is not None:
        return
    probe = activate(_host_watcher)
    ending.install(probe.finish)


def _reimported_main() -> bool:
    """Called from the top of a script that a spawned child (a DataLoader worker, a ddp_spawn rank before its
    function runs) re-imports as ``__mp_main__``: not where a rank starts (it may become one: armed only)."""
    f = sys._getframe(1)
    while f is not None and str(f.f_globals.get("__name__", "")).startswith("ddp_doctor"):
        f = f.f_back
    return f is not None and f.f_code.co_name == "<module>" and f.f_globals.get("__name__") == "__mp_main__"


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 2 if not argv else 0
    module = argv[0] == "-m"
    if module:
        argv = argv[1:]
    target, args = argv[0], argv[1:]
    from ddp_doctor.probe import activate

    probe = activate(_host_watcher)
    if module:
        sys.argv = [target, *args]
    else:
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    program = None  # the program's globals: freed only once its end is on record (see below)
    try:
        if module:
            program = runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            program = runpy.run_path(os.path.abspath(target), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        probe.finish(code, e if code else None, exit_exc=e)
        raise
    except BaseException as e:
        probe.finish(1, e)
        raise
    # the program returned: say so before its globals go (a DDP model among them tears its process group
    # state down, where torch itself can abort: that is then reported as teardown, not as a crash)
    probe.finish(0)
    del program
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
