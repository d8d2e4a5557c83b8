"""``python -m ddp_doctor.probe [-m] SCRIPT|MODULE [ARGS...]``: install the probe, then run the user's program as __main__.

The rank program's entry point, so the one place inside probe/ that wires in the session (the embedded
watcher rank 0 hosts under another launcher); the probe modules themselves depend only on ``store`` and ``evidence``.
"""
from __future__ import annotations

import os
import runpy
import sys


def _host_watcher(address: str) -> None:
    """Rank 0 under another launcher: host the side channel and the watcher in this process."""
    from ddp_doctor.session import embedded

    embedded.start_in_rank0(address)


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
