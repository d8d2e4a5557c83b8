"""Determinism: a failing program gives the same code, culprit ranks and line in every run, on a loaded box.

Runs each failing scenario of tests/scenarios N times under `ddp-doctor run` while `--load` busy processes
(one per core by default) compete for the CPUs, and prints, per scenario, each run's first error finding
(code, ranks, file:line) and whether all runs agree.

    PYTHONPATH=src python benchmarks/determinism.py [--runs 5] [--load 2] [SCENARIO...]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
import manifest  # noqa: E402

DEFAULT = ["seed_001_collate_none_continue", "uneven_early_stop_barrier", "bad_batch_gather_object",
           "rank0_barrier", "helper_is_main_process", "seed_003_early_return_barrier"]


def _burn() -> None:
    while True:
        pass


def run_once(name: str) -> tuple:
    """(verdict, code, ranks, file:line) of the first error finding of one run."""
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "r.json"
        argv = [sys.executable, "-m", "ddp_doctor", "run", "--report", str(report),
                *manifest.doctor_options(name), *manifest.torchrun_argv(name)]
        env = manifest.scenario_env(name, dict(os.environ, PYTHONPATH=str(ROOT / "src")))
        manifest.run_command(argv, timeout=300, env=env)
        if not report.exists():
            return ("no report", None, None, None)
        rep = json.loads(report.read_text())
    err = next((f for f in rep["findings"] if f["severity"] == "error"), None)
    if err is None:
        return (rep["verdict"], None, None, None)
    loc = err.get("location") or {}
    return (rep["verdict"], err["code"], tuple(err["ranks"]), f"{os.path.basename(loc.get('path') or '')}:{loc.get('line')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", default=DEFAULT)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--load", type=int, default=os.cpu_count() or 2, help="busy processes beside the job")
    args = ap.parse_args()
    burners = [multiprocessing.Process(target=_burn, daemon=True) for _ in range(args.load)]
    for b in burners:
        b.start()
    ok = True
    try:
        print(f"| scenario | runs | same | each run (verdict code ranks line) |\n|---|---|---|---|")
        for name in args.scenarios:
            got = [run_once(name) for _ in range(args.runs)]
            same = len(set(got)) == 1
            ok &= same
            each = "; ".join(" ".join(str(x) for x in g) for g in got) if not same else " ".join(map(str, got[0]))
            print(f"| {name} | {args.runs} | {'yes' if same else 'NO'} | {each} |", flush=True)
    finally:
        for b in burners:
            b.terminate()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
