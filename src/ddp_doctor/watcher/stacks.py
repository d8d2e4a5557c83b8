"""Stacks the watcher takes itself: faulthandler dumps (SIGUSR1, or the one a fatal signal left), exit status.

The probe answers stack requests from its own thread; these are the fall-backs for ranks that cannot
(blocked in C with the GIL held, already dead) and for DataLoader workers, which run no probe thread.
"""
from __future__ import annotations

import os
import re
import signal
import time
from ddp_doctor import store as side
from ddp_doctor.evidence import ExitStatus, Site

FATAL = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")


def signal_dumps(run_dir: str, targets: list[tuple[int, str]], wait_s: float = 2.0) -> dict[int, list[Site]]:
    """SIGUSR1 every target (faulthandler writes DIR/<kind>-<pid>.stack), then read what they wrote."""
    sizes: dict[int, tuple[str, int]] = {}
    for pid, kind in targets:
        path = side.stack_file(run_dir, kind, pid)
        try:
            before = os.path.getsize(path)
            os.kill(pid, signal.SIGUSR1)
            sizes[pid] = (path, before)
        except OSError:
            continue
    out: dict[int, list[Site]] = {}
    end = time.monotonic() + wait_s
    while sizes and time.monotonic() < end:
        time.sleep(0.05)
        for pid, (path, before) in list(sizes.items()):
            try:
                if os.path.getsize(path) > before:
                    time.sleep(0.05)
                    with open(path, encoding="utf-8", errors="replace") as f:
                        f.seek(before)
                        out[pid] = parse_faulthandler(f.read())
                    del sizes[pid]
            except OSError:
                del sizes[pid]
    return out


def fatal_stack(run_dir: str, pid: int) -> list[Site]:
    """The stack faulthandler wrote when the rank died of SIGABRT/SIGSEGV (gloo EnforceNotMet, ...)."""
    try:
        with open(side.stack_file(run_dir, "rank", pid), encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        return []
    i = text.rfind("Fatal Python error")
    return parse_faulthandler(text[i:]) if i >= 0 else []


def tore_down(run_dir: str, pid: int) -> bool:
    """Had the rank called destroy_process_group() (the probe leaves a marker file) before it died?"""
    return os.path.exists(side.teardown_file(run_dir, pid))


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


_FH_ESCAPE = re.compile(r"\\(x[0-9a-f]{2}|u[0-9a-f]{4}|U[0-9a-f]{8})")


def _fh_unescape(path: str) -> str:
    """A file name as Python holds it (``co_filename``): faulthandler writes every character past ASCII as an
    escape (``trainé.py`` as ``train\\xe9.py``; the byte 0xff of a name that is not UTF-8 as ``\\udcff``), so its
    frames would match no other record of that file (the probe's stacks, the sources, the snippets)."""
    return _FH_ESCAPE.sub(lambda m: chr(int(m[1][1:], 16)), path) if "\\" in path else path


def parse_faulthandler(text: str) -> list[Site]:
    """The main thread's stack from a faulthandler dump (outermost first); the last dump in ``text``."""
    threads: list[list[Site]] = []
    cur: list[Site] | None = None
    for line in text.splitlines():
        if _FH_THREAD.match(line):
            cur = []
            threads.append(cur)
        else:
            m = _FH_FRAME.match(line)
            if m and cur is not None:
                cur.append(Site(_fh_unescape(m.group(1)), int(m.group(2)), m.group(3).strip()))
    if not threads:
        return []
    # the main thread is the one whose outermost frame is the program's entry (runpy / <module>)
    stacks = [list(reversed(t)) for t in threads]
    for st in stacks:
        if st and (st[0].function in ("<module>", "_run_module_as_main")):
            return st
    return stacks[0]


def peek_exit(pid: int) -> ExitStatus | None:
    """Exit code / signal of a dead child without reaping it; None while it runs."""
    try:
        res = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    except OSError:
        return None
    if res is None:
        return None
    if res.si_code == os.CLD_EXITED:
        return ExitStatus(res.si_status, None)
    try:
        name = signal.Signals(res.si_status).name
    except ValueError:
        name = str(res.si_status)
    return ExitStatus(-res.si_status, name)
