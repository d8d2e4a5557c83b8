"""Tiny multi-rank launcher for the fixes tests: fork N gloo ranks of a script, with a deadline.

usage: python _launch.py NPROCS PORT TIMEOUT SCRIPT [ARGS...]
Prints "RANKCODES <json list>" at the end; exit code 0 when every rank exited 0,
124 on timeout (all ranks killed), else the first non-zero rank code.
"""
import json
import os
import runpy
import signal
import sys
import time

import importlib

import torch  # noqa: F401  (imported once, before fork: each rank starts fast)
import torch.distributed  # noqa: F401

for _mod in filter(None, os.environ.get("DDPD_PRELOAD", "").split(",")):
    importlib.import_module(_mod)


def main() -> int:
    nprocs, port, timeout, script = int(sys.argv[1]), sys.argv[2], float(sys.argv[3]), sys.argv[4]
    args = sys.argv[5:]
    import tempfile
    outdir = tempfile.mkdtemp(prefix="ddpd_fixes_")
    pids = []
    for r in range(nprocs):
        pid = os.fork()
        if pid == 0:
            os.setpgid(0, 0)
            # one output file per rank: lines of different ranks never interleave
            for fd, name in ((1, "out"), (2, "err")):
                f = os.open(os.path.join(outdir, f"rank{r}.{name}"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                os.dup2(f, fd)
                os.close(f)
            os.environ.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nprocs), LOCAL_WORLD_SIZE=str(nprocs),
                              MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            sys.argv = [script, *args]
            code = 0
            try:
                runpy.run_path(script, run_name="__main__")
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        pids.append(pid)
    codes = {}
    deadline = time.monotonic() + timeout
    while len(codes) < nprocs and time.monotonic() < deadline:
        for r, pid in enumerate(pids):
            if r in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[r] = os.waitstatus_to_exitcode(status)
        time.sleep(0.02)
    timed_out = len(codes) < nprocs
    for r, pid in enumerate(pids):
        if r not in codes:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
            codes[r] = None
    for r in range(nprocs):
        for name, stream in (("out", sys.stdout), ("err", sys.stderr)):
            path = os.path.join(outdir, f"rank{r}.{name}")
            with open(path, errors="replace") as f:
                stream.write(f.read())
            os.unlink(path)
    os.rmdir(outdir)
    out = [codes[r] for r in range(nprocs)]
    print("RANKCODES " + json.dumps(out), flush=True)
    if timed_out:
        return 124
    return next((c if c > 0 else 128 - c for c in out if c), 0)


if __name__ == "__main__":
    sys.exit(main())
