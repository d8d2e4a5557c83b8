"""The steps of benchmarks/gpu_check.sh that need more than one command line, and its summary.

Each subcommand writes one JSON file of figures and exits 0 when its step passed, 1 when it failed:

    env      OUT.json            the GPU (NVML, nvidia-smi), torch, CUDA and NCCL versions
    tests    OUT.json FILE...    the real-GPU tests (``-m gpu``), judged from pytest's JUnit XML
    check    OUT.json            ``ddp-doctor check --nproc-per-node 1``, judged from its report
    starved  OUT.json            a data-bound job under ``ddp-doctor run`` (DDP401) with NVML's utilisation
    summary  WORK OUTDIR         summary.json from the steps' status and figures (gpu_check.sh writes summary.txt)

``--dry-run`` (every subcommand): the CPU-only variant that gpu_check.sh --cpu-dry-run runs, so that the
script is exercised here and in CI; its figures are CPU figures and say so, never GPU results.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import threading
import xml.etree.ElementTree as ET
from importlib.util import find_spec
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path[:0] = [str(SRC), str(ROOT / "benchmarks")]

# the one skip a single-GPU machine may report: the DDP301 run needs two GPUs
ALLOWED_GPU_SKIP = "needs >= 2 CUDA GPUs"


def _env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(SRC) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _write(path: str, data: dict) -> None:
    Path(path).write_text(json.dumps(data, indent=1, default=str))


def _ddp_doctor(*args: str, timeout: float, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``python -m ddp_doctor ARGS``; one that runs out of time comes back with exit code 124 (as timeout(1))."""
    cmd = [sys.executable, "-m", "ddp_doctor", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env or _env())
    except subprocess.TimeoutExpired as e:
        def text(b):
            return b.decode(errors="replace") if isinstance(b, bytes) else (b or "")

        return subprocess.CompletedProcess(cmd, 124, text(e.stdout),
                                           text(e.stderr) + f"\n(timed out after {timeout} s)")


# ---------------------------------------------------------------- env

def cmd_env(a) -> int:
    """What the figures were measured on; the GPU steps cannot pass without CUDA and NVML."""
    from ddp_doctor import gpu

    out: dict = {"python": sys.version.split()[0], "executable": sys.executable, "cpus": os.cpu_count()}
    missing = [m for m in ("torch", "rich", "psutil", "pynvml", "pytest", "pytest_timeout") if not find_spec(m)]
    out["missing_modules"] = missing
    try:
        import torch

        out.update(torch=torch.__version__, torch_cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
                   cuda_devices=[torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
                   if torch.cuda.is_available() else [])
    except Exception as e:  # reported, and the step fails below
        out["torch_error"] = repr(e)
    try:
        v = torch.cuda.nccl.version() if out.get("cuda_available") else None
        out["nccl"] = ".".join(map(str, v)) if isinstance(v, tuple) else v
    except Exception as e:
        out["nccl"] = f"unknown ({e!r})"
    snap = gpu.snapshot()
    out["nvml_devices"] = [{k: d[k] for k in ("index", "name", "uuid", "total_mib")} for d in snap["devices"]] \
        if snap else None
    try:
        smi = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20)
        out["nvidia_smi"] = smi.stdout.strip() or smi.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        out["nvidia_smi"] = f"not available ({e.__class__.__name__})"
    names = [d["name"] for d in out["nvml_devices"] or []] or out.get("cuda_devices") or []
    out["gpu_name"] = ", ".join(names) if names else None
    problems = [f"missing Python modules: {', '.join(missing)}"] if missing else []
    if "torch_error" in out:
        problems.append(f"torch failed: {out['torch_error']}")
    if not a.dry_run:
        if not out.get("cuda_available"):
            problems.append(f"torch {out.get('torch')} at {sys.executable} sees no CUDA device (a CPU build? "
                            "set PYTHON to the interpreter whose torch has CUDA)")
        if not snap or not snap["devices"]:
            problems.append("NVML shows no device (no driver, or no nvidia-ml-py)")
    out["problems"] = problems
    _write(a.out, out)
    print(f"GPU: {out['gpu_name'] or 'none'}; torch {out.get('torch')} (CUDA {out.get('torch_cuda')}), "
          f"NCCL {out.get('nccl')}; nvidia-smi: {out['nvidia_smi']}")
    for p in problems:
        print(f"FAIL: {p}")
    return 1 if problems else 0


# ---------------------------------------------------------------- tests

def junit_outcomes(xml_path: str) -> list[dict]:
    """One entry per test case of a pytest JUnit XML file: id, outcome (passed/skipped/failed/error), message."""
    out = []
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        outcome, msg = "passed", ""
        for tag in ("failure", "error", "skipped"):
            el = case.find(tag)
            if el is not None:
                outcome = {"failure": "failed"}.get(tag, tag)
                msg = el.get("message") or ""
                break
        out.append({"id": f"{case.get('classname')}::{case.get('name')}", "outcome": outcome,
                    "message": msg[:500], "time_s": float(case.get("time") or 0)})
    return out


def judge_tests(cases: list[dict], dry_run: bool) -> list[str]:
    """Why the real-GPU tests step fails ([] = passed): none may fail; with a GPU none may skip except the
    ones that need two GPUs; without one every test must skip visibly (a reason given)."""
    problems = []
    if not cases:
        problems.append("no test collected with -m gpu: the marker or the file list is broken")
    for c in cases:
        if c["outcome"] in ("failed", "error"):
            problems.append(f"{c['id']} {c['outcome']}: {c['message'][:200]}")
        elif c["outcome"] == "skipped" and not c["message"]:
            problems.append(f"{c['id']} skipped without a reason")
        elif c["outcome"] == "skipped" and not dry_run and ALLOWED_GPU_SKIP not in c["message"]:
            problems.append(f"{c['id']} skipped on the GPU machine: {c['message'][:200]}")
    return problems


def cmd_tests(a) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        sys.stdout.flush()  # pytest's output follows in the step's log as it runs (a step cut short keeps it)
        p = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "-p", "no:cacheprovider", "-rs", "-q",
                            f"--junitxml={xml}", *a.files], cwd=ROOT, env=_env())
        cases = junit_outcomes(xml) if os.path.exists(xml) else []
    problems = judge_tests(cases, a.dry_run)
    counts = {k: sum(c["outcome"] == k for c in cases) for k in ("passed", "skipped", "failed", "error")}
    _write(a.out, {"pytest_exit": p.returncode, "counts": counts, "cases": cases, "problems": problems})
    print(f"real-GPU tests: {counts}")
    for pr in problems:
        print(f"FAIL: {pr}")
    return 1 if problems else 0


# ---------------------------------------------------------------- check

def cmd_check(a) -> int:
    """``ddp-doctor check`` with one rank: on the GPU machine it must pass on cuda:0 over NCCL."""
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "check.json")
        args = ["check", "--nproc-per-node", "1", "--report", report] + (["--backend", "gloo"] if a.dry_run else [])
        p = _ddp_doctor(*args, timeout=a.timeout)
        print(p.stdout[-8000:] + p.stderr[-4000:])
        rep = json.loads(Path(report).read_text()) if os.path.exists(report) else None
    problems = []
    if rep is None:
        problems.append(f"no report (exit {p.returncode})")
    else:
        if p.returncode != 0 or rep["verdict"] != "ok":
            problems.append(f"verdict {rep['verdict']}, exit {p.returncode}")
        r0 = (rep.get("ranks") or [{}])[0]
        if not a.dry_run and not (str(r0.get("device", "")).startswith("cuda") and r0.get("backend") == "nccl"):
            problems.append(f"rank 0 ran on {r0.get('device')} over {r0.get('backend')}, not cuda over nccl")
    fig = {"exit_code": p.returncode, "report": rep, "problems": problems}
    _write(a.out, fig)
    for pr in problems:
        print(f"FAIL: {pr}")
    return 1 if problems else 0


# ---------------------------------------------------------------- starved (DDP401 + NVML utilisation)

STARVED_JOB = textwrap.dedent('''
    import json, os, time
    import torch, torch.distributed as dist, torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset

    DELAY = float(os.environ["BENCH_DELAY"]); SECONDS = float(os.environ["BENCH_SECONDS"])
    MIN_STEPS = int(os.environ["BENCH_MIN_STEPS"])
    WIDTH = int(os.environ["BENCH_WIDTH"]); BATCH = int(os.environ["BENCH_BATCH"])
    cuda = os.environ["BENCH_DEVICE"] == "cuda"
    dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")

    class Batches(Dataset):
        """Whole batches, each after DELAY s of CPU-side preparation (decoding, augmenting: a sleep stands in)."""
        def __init__(self):
            self.x, self.y = torch.randn(BATCH, WIDTH), torch.randn(BATCH, 1)
        def __len__(self):
            return 10_000_000
        def __getitem__(self, i):
            if DELAY:
                time.sleep(DELAY)
            return self.x, self.y

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo")
    layers = []
    for _ in range(4):
        layers += [nn.Linear(WIDTH, WIDTH), nn.ReLU()]
    model = DDP(nn.Sequential(*layers, nn.Linear(WIDTH, 1)).to(dev), device_ids=[dev.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    loader = DataLoader(Batches(), batch_size=None, num_workers=0)
    steps, t_start = 0, None
    for x, y in loader:
        x, y = x.to(dev), y.to(dev)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
        steps += 1
        if steps == 3:  # warmed up: the window NVML is read in starts here
            sync(); t_start = time.time()
        if t_start is not None and time.time() - t_start >= SECONDS and steps - 3 >= MIN_STEPS:
            break
    sync()
    with open(os.environ["BENCH_OUT"], "w") as f:
        json.dump({"t_start": t_start, "t_end": time.time(), "steps": steps - 3}, f)
    dist.destroy_process_group()
''')


def utilization_stats(samples, t_start: float, t_end: float) -> dict | None:
    """NVML readings of device 0 inside the job's training window: how many, mean, median, share near 0/100."""
    vals = [s.gpu_pct[0] for s in samples or [] if t_start <= s.t <= t_end and s.gpu_pct]
    if not vals:
        return None
    n = len(vals)
    return {"n": n, "mean_pct": round(statistics.fmean(vals), 1), "median_pct": statistics.median(vals),
            "min_pct": min(vals), "max_pct": max(vals), "share_at_most_5_pct": round(sum(v <= 5 for v in vals) / n, 3),
            "share_at_least_90_pct": round(sum(v >= 90 for v in vals) / n, 3), "readings": vals}


def utilization_text(u: dict | None, note: str | None = None) -> str:
    if not u:
        return note or "not measured"
    return (f"mean {u['mean_pct']}%, median {u['median_pct']}%, {u['share_at_most_5_pct']:.0%} of readings <= 5%, "
            f"{u['share_at_least_90_pct']:.0%} >= 90% ({u['n']} readings)")


def starved_run(a, delay: float, seconds: float, tmp: str) -> dict:
    """One job under ``ddp-doctor run`` (1 rank) with NVML sampled beside it: the report's data/step split and
    findings, and the utilisation NVML reported while the job trained."""
    from ddp_doctor import gpu
    from ddp_doctor.diagnose.perf import rank_split

    tag = f"delay{delay:g}"
    script, report, truth = (os.path.join(tmp, f"{tag}{ext}") for ext in ("_job.py", "_report.json", "_job.json"))
    Path(script).write_text(STARVED_JOB)
    env = dict(_env(), BENCH_DELAY=str(delay), BENCH_SECONDS=str(seconds), BENCH_MIN_STEPS=str(a.min_steps),
               BENCH_WIDTH=str(a.width), BENCH_BATCH=str(a.batch), BENCH_DEVICE=a.device, BENCH_OUT=truth)
    stop, box = threading.Event(), {}
    sampler = threading.Thread(target=lambda: box.update(s=gpu.sample_utilization(stop, 0.1)), daemon=True)
    sampler.start()
    try:
        p = _ddp_doctor("run", "--no-lint", "--report", report, "--nproc-per-node", "1", "--standalone", script,
                        timeout=a.timeout, env=env)
    finally:
        stop.set()
        sampler.join(10)
    out: dict = {"delay_s_per_batch": delay, "exit_code": p.returncode}
    if not os.path.exists(report) or not os.path.exists(truth):
        out["error"] = f"the job left no report or no timing (exit {p.returncode}): {p.stderr[-1500:]}"
        return out
    rep, job = json.loads(Path(report).read_text()), json.loads(Path(truth).read_text())
    split = rank_split(rep["ranks"][0]) or {}
    ddp401 = [f for f in rep["findings"] if f["code"] == "DDP401"]
    out.update(verdict=rep["verdict"], steps=job["steps"], seconds=round(job["t_end"] - job["t_start"], 2),
               codes=sorted({f["code"] for f in rep["findings"]}),
               ddp401_message=ddp401[0]["message"] if ddp401 else None,
               split_ms={k: round(v * 1000, 2) for k, v in split.items() if k.endswith("_s")},
               utilization=utilization_stats(box.get("s"), job["t_start"], job["t_end"]),
               utilization_note=None if box.get("s") else "not measured: NVML unavailable (no GPU driver here)")
    return out


def cmd_starved(a) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        runs = {"starved": starved_run(a, a.delay, a.seconds, tmp)}
        if a.control:
            runs["fed"] = starved_run(a, 0.0, a.seconds, tmp)
    problems = []
    for name, r in runs.items():
        if "error" in r:
            problems.append(f"{name}: {r['error']}")
            continue
        if r["verdict"] != "ok" or r["exit_code"] != 0:
            problems.append(f"{name}: verdict {r['verdict']}, exit {r['exit_code']}")
        if ("DDP401" in r["codes"]) != (name == "starved"):
            problems.append(f"{name}: DDP401 {'missing' if name == 'starved' else 'reported'} (codes {r['codes']})")
        if a.device == "cuda" and not (r["utilization"] and r["utilization"]["n"] >= 5):
            problems.append(f"{name}: fewer than 5 NVML readings inside the training window")
    _write(a.out, {"device": a.device, "width": a.width, "batch": a.batch, "runs": runs, "problems": problems})
    for name, r in runs.items():
        print(f"{name}: {r.get('steps')} steps in {r.get('seconds')} s, split (ms/step) {r.get('split_ms')}, "
              f"codes {r.get('codes')}; GPU utilisation (NVML): "
              f"{utilization_text(r.get('utilization'), r.get('utilization_note'))}")
    for pr in problems:
        print(f"FAIL: {pr}")
    return 1 if problems else 0


# ---------------------------------------------------------------- summary

def headline(step: str, fig: dict | None) -> str:
    """One line of figures per step for summary.txt."""
    if not fig:
        return "no figures"
    try:
        if step == "env":
            return f"GPU {fig.get('gpu_name') or 'none'}; torch {fig.get('torch')}; nvidia-smi: {fig.get('nvidia_smi')}"
        if step == "tests":
            return ", ".join(f"{k} {v}" for k, v in fig["counts"].items())
        if step == "overhead":
            m = fig["median"]
            parts = [f"{k} {v:.2f}" for k, v in m.items() if v is not None]
            if m.get("a_doctor") is not None and m.get("a_torchrun") is not None:
                parts.append(f"added per collective {m['a_doctor'] - m['a_torchrun']:+.2f} us")
            return f"{fig['backend']}, {fig['nproc']} rank(s): " + ", ".join(parts) + \
                f"; bookkeeping {fig['bookkeeping_us']:.2f} us"
        if step == "prefetch":
            from data_wait import PrefetchRates  # benchmarks/, beside this script

            return PrefetchRates(**fig["prefetch"]).line() if fig.get("prefetch") else "not measured"
        if step == "check":
            rep = fig.get("report") or {}
            r0 = (rep.get("ranks") or [{}])[0]
            bw = ", ".join(f"{b['bytes']} B {b['algbw_GBps']:.1f} GB/s" for b in rep.get("bandwidth") or [])
            return f"verdict {rep.get('verdict')} on {r0.get('device_name')} over {r0.get('backend')}; algbw {bw}"
        if step == "ddp401":
            out = []
            for name, r in fig["runs"].items():
                split = r.get("split_ms") or {}
                out.append(f"{name}: codes {r.get('codes')}, data {split.get('data_s')} of {split.get('step_s')} "
                           f"ms/step, NVML utilisation {utilization_text(r.get('utilization'))}")
            return "; ".join(out)
    except (KeyError, TypeError, ZeroDivisionError) as e:
        return f"figures unreadable ({e!r})"
    return ""


def cmd_summary(a) -> int:
    """summary.json: mode, the GPU, each step's status, time, limit and figures; headlines appended to summary.txt."""
    work, outdir = Path(a.work), Path(a.outdir)
    steps = []
    for line in (work / "status.tsv").read_text().splitlines():
        name, status, secs, limit, rc = line.split("\t")
        fpath = work / f"{name}.json"
        fig = None
        if fpath.exists():
            try:
                fig = json.loads(fpath.read_text())
            except ValueError:
                fig = None
        steps.append({"name": name, "status": status, "seconds": float(secs), "limit_s": int(limit),
                      "exit_code": int(rc), "figures": fig,
                      "headline": "not run (not selected)" if status == "not-selected" else headline(name, fig)})
    env = next((s["figures"] for s in steps if s["name"] == "env"), None) or {}
    summary = {"schema": "ddp-doctor/gpu-check/v1", "mode": a.mode, "gpu": env.get("gpu_name"),
               "measured_on_gpu": a.mode == "gpu" and bool(env.get("cuda_available")),
               "started_at": a.started_at, "steps": steps,
               "failed": [s["name"] for s in steps if s["status"] not in ("pass", "not-selected")]}
    _write(str(outdir / "summary.json"), summary)
    with open(outdir / "summary.txt", "a") as f:
        f.write("\nfigures (" + ("GPU: " + str(summary["gpu"]) if summary["measured_on_gpu"]
                                 else "CPU dry run: none of these is a GPU figure") + ")\n")
        for s in steps:
            f.write(f"  {s['name']:<9} {s['headline']}\n")
    return 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("env", "tests", "check", "starved"):
        p = sub.add_parser(name)
        p.add_argument("out", help="the step's figures (JSON)")
        p.add_argument("--dry-run", action="store_true", help="CPU only: check the step, measure nothing on a GPU")
        p.add_argument("--timeout", type=float, default=240, help="seconds for one job of the step")
        if name == "tests":
            p.add_argument("files", nargs="+", help="test files holding the gpu-marked tests")
        if name == "starved":
            p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
            p.add_argument("--seconds", type=float, default=8.0, help="training time per job (after 3 warm-up steps)")
            p.add_argument("--min-steps", type=int, default=10, help="and at least this many steps")
            p.add_argument("--delay", type=float, default=0.04, help="CPU seconds per batch in the starved job")
            p.add_argument("--width", type=int, default=4096)
            p.add_argument("--batch", type=int, default=512)
            p.add_argument("--no-control", dest="control", action="store_false",
                           help="skip the fed twin (same job, no delay: DDP401 must not fire)")
    p = sub.add_parser("summary")
    p.add_argument("work")
    p.add_argument("outdir")
    p.add_argument("--mode", choices=("gpu", "cpu-dry-run"), required=True)
    p.add_argument("--started-at", default="")
    a = ap.parse_args(argv)
    return {"env": cmd_env, "tests": cmd_tests, "check": cmd_check, "starved": cmd_starved,
            "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
