"""How `ddp-doctor report FILE` scales with the report's size: wall time and peak memory (issue 28).

Writes reports of growing size of two shapes (one long finding message; many ranks' timelines, 2,000
events each, as a large job leaves them), renders each with `ddp-doctor report` in a child process
(`--color never`, optionally `--html`) and prints a table: size, seconds, peak resident MiB, exit code.

    python benchmarks/report_render.py [--src DIR] [--html] [--limit-s 120] [--big]

``--src`` picks the source tree to measure (e.g. an older checkout's ``src`` for a before/after);
``--big`` adds the 200 MB cases.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def long_message(path: Path, chars: int) -> None:
    msg = "word " * (chars // 5)
    finding = {"code": "DDP204", "name": "rank-exited", "severity": "error", "title": "t", "message": msg,
               "ranks": [0], "location": None, "evidence": {}, "fix": "f"}
    path.write_text(json.dumps({"schema": "ddp-doctor/report/v1", "verdict": "crash", "exit_code": 1,
                                "world_size": 2, "findings": [finding], "ranks": []}))


def timelines(path: Path, ranks: int, events: int = 2000) -> None:
    with open(path, "w") as fh:
        fh.write('{"schema": "ddp-doctor/report/v1", "verdict": "ok", "exit_code": 0, "world_size": %d, '
                 '"findings": [], "ranks": [' % ranks)
        for r in range(ranks):
            tl = [{"t": round(i * 0.01, 4), "kind": "step" if i % 2 else "collective", "dur": 0.00512,
                   "label": f"step {i}" if i % 2 else "ddp.backward(allreduce_grads)"} for i in range(events)]
            fh.write(("," if r else "") + json.dumps({
                "rank": r, "state": "finished", "epoch": 1, "step": events, "last_collective": None,
                "stack": [{"path": "/job/train.py", "line": 3, "function": "main"}], "exit_code": 0,
                "signal": None, "timeline": tl}))
        fh.write("]}")


def render(src: str, path: Path, html: bool, limit_s: float) -> tuple[float, float, float, int | str]:
    """(wall seconds, CPU seconds, peak MiB, exit code or 'timeout') of one `ddp-doctor report` in a child
    process (CPU time is the steadier figure on a shared machine)."""
    cmd = [sys.executable, "-m", "ddp_doctor", "report", str(path), "--color", "never"]
    if html:
        cmd += ["--html", str(path.with_suffix(".html"))]
    env = dict(os.environ, PYTHONPATH=src)
    t0 = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = t0 + limit_s
    while True:
        pid, status, usage = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        if time.monotonic() > deadline:
            p.kill()
            _, status, usage = os.wait4(p.pid, 0)
            return time.monotonic() - t0, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, "timeout"
        time.sleep(0.02)
    return (time.monotonic() - t0, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024,
            os.waitstatus_to_exitcode(status))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--src", default=str(HERE.parent / "src"), help="the ddp_doctor source tree to measure")
    ap.add_argument("--html", action="store_true", help="also write the HTML page")
    ap.add_argument("--limit-s", type=float, default=120.0, help="stop a render after this long")
    ap.add_argument("--big", action="store_true", help="add the 200 MB reports")
    a = ap.parse_args()
    cases = [("message", 1 << 20), ("message", 4 << 20), ("message", 16 << 20),
             ("timeline ranks", 50), ("timeline ranks", 350)]
    if a.big:
        cases += [("message", 200_000_000), ("timeline ranks", 1400)]
    print(f"source: {a.src}   html: {a.html}")
    print(f"| shape | size | file MB | wall s | CPU s | peak MiB | exit |\n|---|---|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory(prefix="ddpd-render-") as tmp:
        for shape, n in cases:
            path = Path(tmp) / "r.json"
            (long_message if shape == "message" else timelines)(path, n)
            size = f"{n / 1e6:.3g} M chars" if shape == "message" else f"{n} x 2000 events"
            secs, cpu, mib, code = render(a.src, path, a.html, a.limit_s)
            print(f"| {shape} | {size} | {path.stat().st_size / 1e6:.0f} | {secs:.1f} | {cpu:.1f} | {mib:.0f} "
                  f"| {code} |", flush=True)


if __name__ == "__main__":
    main()
