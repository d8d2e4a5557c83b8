"""``python fr_dump_on_error.py SCRIPT ARGS...``: run a training script as ``__main__`` and write this rank's
Flight Recorder buffer (``ddp_doctor.flightrec.write_dump``) however the rank ends.

gloo records every collective (TORCH_FR_BUFFER_SIZE) but never dumps by itself; the README's way is to write
the dump when a collective raises.  The parity tests also need the dump of a rank that ends otherwise: one
that finished (a clean job's recorder must read clean), and one blocked outside any collective that the
launcher SIGTERMs once another rank failed (a stalled rank: its recorder shows the collective it never
reached).  A SIGTERM that arrives while the dump is being written is ignored, so the launcher's stop of the
other ranks cannot cut a dump in half."""
import runpy
import signal
import sys
from pathlib import Path

from ddp_doctor.flightrec import write_dump

_dumping = False


def _dump_once() -> None:
    global _dumping
    if not _dumping:
        _dumping = True
        write_dump()


def _on_sigterm(signum, frame):
    if not _dumping:
        raise SystemExit(128 + signum)  # unwinds through the finally below, which writes the dump


if __name__ == "__main__":
    script = sys.argv[1]
    sys.argv = sys.argv[1:]
    sys.path[0] = str(Path(script).resolve().parent)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        _dump_once()
