"""Python stacks of live processes, read with py-spy without stopping them.

py-spy reads the interpreter's memory through ptrace/process_vm_readv; ``--nonblocking`` never
pauses the target (a training job must not notice).  A read can catch the interpreter mid-update,
so a failed read is retried a few times before it counts.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from ddp_doctor.evidence import Site, ThreadStack


class AttachError(RuntimeError):
    """A problem the user can fix; the message says how (printed as one line, no traceback)."""


PTRACE_HELP = ("reading another process's memory was not permitted (ptrace). Run ddp-doctor attach as the "
               "same user as the job or as root; on hosts with Yama set `sysctl kernel.yama.ptrace_scope=0` "
               "(or 1 and run as the job's parent/root); in a container start it with --cap-add SYS_PTRACE "
               "(Docker) or securityContext.capabilities.add: [SYS_PTRACE] (Kubernetes)")
PYSPY_HELP = ("py-spy is not installed; it reads the ranks' Python stacks without stopping them: "
              "pip install py-spy  (or pip install 'ddp-doctor[attach]')")


def pyspy_path() -> str:
    """The py-spy executable (next to this Python first: a venv's bin may not be on PATH)."""
    here = os.path.join(os.path.dirname(sys.executable), "py-spy")
    found = here if os.access(here, os.X_OK) else shutil.which("py-spy")
    if not found:
        raise AttachError(PYSPY_HELP)
    return found


def _denied(text: str) -> bool:
    t = text.lower()
    return ("permission denied" in t or "operation not permitted" in t or "eperm" in t
            or "ptrace" in t and "denied" in t)


def parse_pyspy_json(text: str, pid: int | None = None) -> list[ThreadStack]:
    """``py-spy dump --json`` output (innermost frame first) -> thread stacks (outermost first).

    The main thread is the one whose OS thread id is the PID (the first thread when py-spy does not say)."""
    raw = json.loads(text)
    main_id = pid if any(th.get("os_thread_id") == pid for th in raw) else (raw[0].get("os_thread_id") if raw else None)
    out = []
    for th in raw:
        frames = tuple(Site(f.get("filename") or "?", int(f.get("line") or 0), f.get("name"))
                       for f in reversed(th.get("frames") or []))
        out.append(ThreadStack(str(th.get("thread_name") or th.get("os_thread_id") or th.get("thread_id")),
                               th.get("os_thread_id") == main_id, frames))
    return out


def stack_key(t: ThreadStack | None) -> tuple:
    """What "the stack has not changed" compares."""
    return tuple((f.path, f.line, f.function) for f in t.frames) if t else ()


def dump(pid: int, retries: int = 4, timeout_s: float = 20.0) -> list[ThreadStack]:
    """Every thread's Python stack of ``pid``; AttachError when ptrace is refused, ProcessLookupError when gone."""
    exe = pyspy_path()
    last = ""
    for _ in range(retries):
        try:
            p = subprocess.run([exe, "dump", "--pid", str(pid), "--json", "--nonblocking"], capture_output=True,
                               text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            last = f"py-spy did not answer within {timeout_s:.0f}s"
            continue
        if p.returncode == 0 and p.stdout.strip().startswith("["):
            try:
                return parse_pyspy_json(p.stdout, pid)
            except ValueError as e:
                last = f"unreadable py-spy output: {e}"
                continue
        last = (p.stderr or p.stdout).strip()
        if _denied(last):
            raise AttachError(f"cannot read process {pid}: {PTRACE_HELP}")
        if not os.path.exists(f"/proc/{pid}"):
            raise ProcessLookupError(pid)
    raise AttachError(f"py-spy could not read the stack of process {pid}: {last.splitlines()[-1] if last else '?'}")


def main_thread(threads: list[ThreadStack]) -> ThreadStack | None:
    """The process's main thread."""
    return next((t for t in threads if t.main), threads[0] if threads else None)
