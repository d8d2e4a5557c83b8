"""Whose code is this frame?  One answer for the probe (where a rank is), diagnosis (which line to blame)
and the reports (where a rank stopped): "the culprit is the rank's innermost *user* frame".

Three kinds of source file:
- ``internal``: ddp-doctor itself (not its demo scripts, which play the user), torch, the interpreter's
  plumbing (``<frozen ...>``, ``<string>``, runpy, threading, contextlib, functools) — never blamed;
- ``library``: the standard library and installed packages (site-/dist-packages: Lightning,
  accelerate...) — blamed only when no user frame exists (a probe's fallback);
- ``user``: everything else — the training script and the user's own modules.

Stdlib only (the probe imports it in every rank); the answer per path is cached, so the probe's
per-collective frame walk stays cheap.
"""
from __future__ import annotations

import functools
import os
import sysconfig
from typing import Sequence, TypeVar

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_DEMO_DIR = _PKG_DIR + "demo" + os.sep
_STDLIB = tuple(sorted({os.path.abspath(p) + os.sep for p in (sysconfig.get_paths().get("stdlib"),
                                                              sysconfig.get_paths().get("platstdlib"),
                                                              os.path.dirname(os.__file__)) if p}))
_PLUMBING = ("runpy.py", "threading.py", "contextlib.py", "functools.py")
_TORCH = os.sep + "torch" + os.sep  # torch's package directory, wherever installed (also on other nodes)

INTERNAL, LIBRARY, USER = "internal", "library", "user"


@functools.lru_cache(maxsize=4096)
def kind(path: str | None) -> str:
    """``internal`` | ``library`` | ``user`` for a frame's file name."""
    if not path:
        return INTERNAL
    p = str(path)
    if p.startswith("<"):
        return INTERNAL
    norm = p.replace("\\", "/")
    in_pkg = p.startswith(_PKG_DIR) or "/ddp_doctor/" in norm
    if in_pkg and not (p.startswith(_DEMO_DIR) or "/ddp_doctor/demo/" in norm):
        return INTERNAL
    if p.endswith(_PLUMBING) or _TORCH in p:
        return INTERNAL
    if "site-packages" in p or "dist-packages" in p or p.startswith(_STDLIB):
        return LIBRARY
    return USER


def is_user(path: str | None) -> bool:
    return kind(path) == USER


def is_internal(path: str | None) -> bool:
    return kind(path) == INTERNAL


F = TypeVar("F")


def innermost_user(stack: Sequence[F] | None, path=lambda f: f.path) -> F | None:
    """The innermost user frame of ``stack`` (outermost first, as in a traceback), or None."""
    for f in reversed(stack or ()):
        if is_user(path(f)):
            return f
    return None


def user_site_of(frame, internal=None, past=None) -> tuple[str, int, str] | None:
    """(path, line, function) of a live frame's innermost user frame (walking ``f_back``); failing that,
    the innermost library frame (a Lightning loop, say); never an internal one.  ``internal``: called with
    the code of each internal frame on the way (the probe's API lookup, ``probe/apisite.py``); ``past``: a
    user frame it answers True for is walked past (a user's ``Module.forward`` run by torch)."""
    fallback = None
    f = frame
    while f is not None:
        code = f.f_code
        k = kind(code.co_filename)
        if k == USER:
            if past is None or not past(f):
                return (code.co_filename, f.f_lineno, code.co_name)
        elif k == LIBRARY:
            if fallback is None:
                fallback = (code.co_filename, f.f_lineno, code.co_name)
        elif internal is not None:
            internal(code)
        f = f.f_back
    return fallback


def is_tooling(path: str) -> bool:
    """ddp-doctor's own frames and the interpreter's start-up (runpy, frozen importlib): left out of the
    stacks and tracebacks a report shows (torch and library frames stay: they say where a rank waits)."""
    return (path.startswith(_PKG_DIR) and not path.startswith(_DEMO_DIR)) or path.startswith("<frozen") \
        or path.endswith("runpy.py")


def live_frames(frame) -> list[tuple[str, int, str]]:
    """A live stack as (path, line, function), outermost first; ddp-doctor's own frames dropped."""
    out = []
    f = frame
    while f is not None:
        code = f.f_code
        fn = code.co_filename
        if not is_tooling(fn):
            out.append((fn, f.f_lineno, code.co_name))
        f = f.f_back
    out.reverse()
    return out

