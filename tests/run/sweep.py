"""dev helper: run scenarios (tests/scenarios) under ddp-doctor run, N at a time; print problems."""
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
import manifest  # noqa: E402


def one(name):
    out = Path(f"/tmp/sw_{name}.json")
    if out.exists():
        out.unlink()
    env = manifest.scenario_env(name, dict(os.environ, PYTHONPATH=str(ROOT / "src")))
    t = time.monotonic()
    res = manifest.run_command([sys.executable, "-m", "ddp_doctor", "run", "--report", str(out),
                                *manifest.doctor_options(name), *manifest.torchrun_argv(name)],
                               timeout=200, env=env)
    rep = json.loads(out.read_text()) if out.exists() else {}
    probs = manifest.report_problems(name, rep) if rep else ["no report"]
    if res.leftovers:
        probs.append(f"leftovers {res.leftovers}")
    Path(f"/tmp/sw_{name}.log").write_text(res.stdout + res.stderr)
    return name, rep.get("verdict"), round(time.monotonic() - t, 1), probs, rep.get("detection")


names = sys.argv[2:] or manifest.names(issue="run")
with ThreadPoolExecutor(int(sys.argv[1])) as pool:
    for name, verdict, dt, probs, det in pool.map(one, names):
        print(("OK  " if not probs else "BAD ") + f"{name:34s} {verdict} {dt}s {probs} {det}", flush=True)
