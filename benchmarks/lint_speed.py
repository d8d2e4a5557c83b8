"""Benchmark ``ddp-doctor lint`` on the installed torch source tree, and TorchFix on a part of it.

    PYTHONPATH=src python benchmarks/lint_speed.py [--subset distributed] [--no-torchfix]

Both run on one core (ddp-doctor is single-process; TorchFix gets ``--jobs 1``), measured in
the same run, so the speed ratio compares like with like on whatever machine this is.
Prints files/s, total findings, per-file errors and crashes (a crash = an exception that
escaped a rule, reported as an "internal error" entry; the linter never raises).
TorchFix is optional (``pip install torchfix``); the comparison is skipped when it is absent.
It never imports torch: the tree is located with importlib.util.find_spec.
"""
from __future__ import annotations

import argparse
import collections
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from ddp_doctor.lint import discover, lint_paths  # noqa: E402


def torch_tree() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("torch is not installed: nothing to benchmark on")
    return Path(list(spec.submodule_search_locations)[0])


def run_ddp_doctor(path: Path) -> dict:
    files, _ = discover([path])
    t0, c0 = time.perf_counter(), time.process_time()
    res = lint_paths([path])
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    crashes = [e for e in res.errors if e.message.startswith("internal error")]
    return {"files": len(files), "wall": wall, "cpu": cpu, "findings": len(res.findings),
            "errors": res.errors, "crashes": crashes,
            "by_code": collections.Counter(f.code for f in res.findings)}


def run_torchfix(path: Path) -> dict | None:
    exe = shutil.which("torchfix") or (str(Path(sys.executable).with_name("torchfix"))
                                       if Path(sys.executable).with_name("torchfix").exists() else None)
    if exe is None:
        return None
    files = [p for p in path.rglob("*.py")]
    t0 = time.perf_counter()
    p = subprocess.run([exe, "--jobs", "1", "--select", "ALL", str(path)], capture_output=True, text=True)
    wall = time.perf_counter() - t0
    # children's CPU time: TorchFix's own process
    cpu = os.times().children_user + os.times().children_system
    findings = sum(1 for line in p.stdout.splitlines() if ": TOR" in line)
    return {"files": len(files), "wall": wall, "cpu": cpu, "findings": findings, "rc": p.returncode}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subset", default="distributed", help="sub-directory of torch for the TorchFix comparison")
    ap.add_argument("--no-torchfix", action="store_true")
    args = ap.parse_args(argv)

    tree = torch_tree()
    print(f"python {sys.version.split()[0]}, torch tree {tree}")
    whole = run_ddp_doctor(tree)
    print(f"\nddp-doctor lint, whole torch tree: {whole['files']} files in {whole['wall']:.1f} s wall "
          f"({whole['cpu']:.1f} s CPU, one process) = {whole['files'] / whole['cpu']:.0f} files/s (CPU)")
    print(f"  findings: {whole['findings']} {dict(sorted(whole['by_code'].items()))}")
    print(f"  per-file errors: {len(whole['errors'])}, crashes: {len(whole['crashes'])}")
    for e in whole["errors"]:
        print(f"    {e.path}: {e.message}")

    if args.no_torchfix:
        return 0
    sub = tree / args.subset
    ours = run_ddp_doctor(sub)
    before = os.times()
    theirs = run_torchfix(sub)
    if theirs is None:
        print("\nTorchFix is not installed (pip install torchfix): comparison skipped")
        return 0
    theirs["cpu"] -= before.children_user + before.children_system
    print(f"\nSame files, same run, one core: torch/{args.subset} ({ours['files']} files)\n")
    print("| tool | wall s | CPU s | files/s (CPU) | findings |")
    print("|---|---:|---:|---:|---:|")
    for name, r in (("ddp-doctor lint", ours), ("TorchFix --jobs 1 --select ALL", theirs)):
        print(f"| {name} | {r['wall']:.1f} | {r['cpu']:.1f} | {r['files'] / max(r['cpu'], 1e-9):.0f} | "
              f"{r['findings']} |")
    print(f"\nspeed ratio (CPU time, TorchFix / ddp-doctor): {theirs['cpu'] / max(ours['cpu'], 1e-9):.0f}x")
    print(f"speed ratio (wall time): {theirs['wall'] / max(ours['wall'], 1e-9):.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
