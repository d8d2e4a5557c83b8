"""Every thread's Python stack as text (``  File "...", line N in f``, most recent call first), taken from
the probe's thread 4x a second.

Not ``faulthandler.dump_traceback(all_threads=True)``: it walks the interpreter's thread states without
CPython's HEAD lock, while a C thread may be making or ending a thread state (a gloo or autograd thread
running a Python callback: a DDP comm hook, ZeRO's overlap, Join); the walk then reads a NULL ``cframe``
and the rank dies of SIGSEGV in ``dump_traceback`` (twice on this machine, in CPython 3.11.7: "segfault at
8 ... in libpython3.11", ``dump_traceback+137``; once a correct Join + ZeRO trap job in a fresh-clone CI
run).  ``sys._current_frames()`` takes that lock.

Its frame objects are held only inside a switch interval long enough that no other thread runs: a frame
object held while its function returns takes over that function's locals, and the probe's thread would
then free them (a DDP model torn down outside the thread that used it aborts the rank, "terminate called
without an active exception")."""
from __future__ import annotations

import contextlib
import re
import sys
import threading

_FRAME = re.compile(rb'^  File "(.*)", line (\d+) in (.*)$', re.M)
MAX_FRAMES = 100  # as faulthandler: the innermost 100


@contextlib.contextmanager
def held_frames():
    """``sys._current_frames()``, held only while no other thread runs (a long switch interval): a frame
    object held while its function returns would take over that function's locals (see above)."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(10.0)
    frames = None
    try:
        frames = sys._current_frames()
        yield frames
    finally:
        if frames is not None:
            frames.clear()
        sys.setswitchinterval(interval)


class StackDumper:
    """One per probe; used from the publisher thread."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def dump(self) -> dict[int, bytes]:
        """{thread ident: its stack text (most recent call first)}; {} when it cannot be taken."""
        with self.lock:
            out: dict[int, bytes] = {}
            try:
                with held_frames() as frames:
                    for ident, f in frames.items():
                        lines = []
                        while f is not None and len(lines) < MAX_FRAMES:
                            code = f.f_code
                            lines.append(f'  File "{code.co_filename}", line {f.f_lineno} in {code.co_name}\n')
                            f = f.f_back
                        out[ident] = _encode("".join(lines))
                    f = None
            except Exception:  # noqa: BLE001 - no stacks this time
                return {}
        return out


def _encode(text: str) -> bytes:
    """A stack's text as bytes; a file name that is not UTF-8 keeps its own bytes (``frames`` gives back the
    same str, as ``os.fsdecode`` made it), any other lone surrogate is escaped."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


def frames(text: bytes) -> list[tuple[str, int, str]]:
    """(path, line, function) of one thread's stack text, outermost first."""
    out = [(m.group(1).decode("utf-8", "surrogateescape"), int(m.group(2)),
            m.group(3).decode("utf-8", "surrogateescape").strip())
           for m in _FRAME.finditer(text)]
    out.reverse()
    return out


def signature(text: bytes | None) -> int:
    """A number that changes when the thread's stack (any frame, any line) changes."""
    return hash(text) & 0x7FFFFFFFFFFF if text else 0
