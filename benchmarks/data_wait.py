"""Is ddp-doctor's data-wait measurement honest?  Measured vs injected vs true data wait, as a table.

For each (per-sample delay, num_workers) a 2-rank gloo job runs under
``ddp-doctor run``.  Its dataset sleeps ``delay`` per sample (the injected
cost) and measures the time it really spent inside ``__getitem__``; the
training loop times its own ``next()`` calls with a stopwatch (the truth the
probe must match, measured without the probe).  The table compares the probe's
per-step data wait (from the report, as DDP401 reads it) with both.

    PYTHONPATH=src python benchmarks/data_wait.py [--delays 0.002,0.005] [--workers 0,2] [--steps 40]

With num_workers=0 the injected wait per step is batch_size x delay; with W
workers the loader works ahead, and the expected wait is about
max(0, batch_size x delay / W - rest of the step).

Where CUDA is available it also measures ddp_doctor.fixes.CUDAPrefetcher on/off
samples/s; on a CPU-only machine it says that this was not measured.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(SRC))

JOB = textwrap.dedent('''
    import json, os, sys, time
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, Dataset, DistributedSampler

    DELAY = float(os.environ["BENCH_DELAY"]); WORKERS = int(os.environ["BENCH_WORKERS"])
    STEPS = int(os.environ["BENCH_STEPS"]); BATCH = 8

    class Slow(Dataset):
        def __len__(self):
            return STEPS * BATCH * 2
        def __getitem__(self, i):
            t = time.perf_counter()
            time.sleep(DELAY)
            x = torch.full((64,), float(i))
            Slow.spent += time.perf_counter() - t
            return x, i % 2
    Slow.spent = 0.0

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = Slow()
    loader = DataLoader(ds, batch_size=BATCH, sampler=DistributedSampler(ds, shuffle=False), num_workers=WORKERS)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    waits = []
    it = iter(loader)
    for step in range(STEPS):
        t = time.perf_counter()
        x, y = next(it)
        waits.append(time.perf_counter() - t)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(); loss.backward(); opt.step()
    out = {"stopwatch_s": waits, "getitem_s": Slow.spent, "batches": STEPS}
    with open(os.path.join(os.environ["BENCH_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.destroy_process_group()
''')


def _port() -> int:
    for _ in range(200):
        p = random.randint(31000, 31898)
        try:
            with socket.socket() as a, socket.socket() as b:
                a.bind(("127.0.0.1", p))
                b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port")


def run_one(delay: float, workers: int, steps: int, tmp: Path) -> dict:
    from ddp_doctor.diagnose.perf import rank_split

    script = tmp / "job.py"
    script.write_text(JOB)
    out = tmp / f"d{delay}_w{workers}"
    out.mkdir(exist_ok=True)
    report = out / "report.json"
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1", BENCH_DELAY=str(delay),
               BENCH_WORKERS=str(workers), BENCH_STEPS=str(steps), BENCH_OUT=str(out))
    cmd = [sys.executable, "-m", "ddp_doctor", "run", "--no-lint", "--report", str(report),
           "--nproc-per-node", "2", "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_port()}", str(script)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)
    if not report.exists():
        raise RuntimeError(f"ddp-doctor run failed ({p.returncode}):\n{p.stderr[-2000:]}")
    rep = json.loads(report.read_text())
    rows = []
    for rk in rep["ranks"]:
        truth = json.loads((out / f"rank{rk['rank']}.json").read_text())
        sw = truth["stopwatch_s"][1:]  # the probe's steps start at the first optimizer step
        split = rank_split(rk) or {}
        rows.append({"rank": rk["rank"], "measured": split.get("data_s"), "step": split.get("step_s"),
                     "stopwatch": sum(sw) / len(sw), "getitem": truth["getitem_s"] / truth["batches"],
                     "codes": sorted({f["code"] for f in rep["findings"] if f.get("source", "runtime") == "runtime"})})
    return {"delay": delay, "workers": workers, "rows": rows}


def prefetcher_line() -> str:
    try:
        import torch
    except ImportError:
        return "CUDAPrefetcher on/off: not measured (torch not installed)"
    if not torch.cuda.is_available():
        return "CUDAPrefetcher on/off samples/s: not measured (no CUDA device on this machine)"
    from torch.utils.data import DataLoader, TensorDataset

    from ddp_doctor.fixes import CUDAPrefetcher

    dev = torch.device("cuda", 0)
    ds = TensorDataset(torch.randn(4096, 3, 64, 64), torch.randint(0, 10, (4096,)))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 64 * 64, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).to(dev)

    def rate(prefetch: bool) -> float:
        loader = DataLoader(ds, batch_size=256, pin_memory=True, num_workers=2)
        it = CUDAPrefetcher(loader, dev) if prefetch else ((x.to(dev), y.to(dev)) for x, y in loader)
        torch.cuda.synchronize()
        t = time.perf_counter()
        n = 0
        for x, y in it:
            model(x).sum().backward()
            n += len(x)
        torch.cuda.synchronize()
        return n / (time.perf_counter() - t)

    off, on = rate(False), rate(True)
    return f"CUDAPrefetcher samples/s: off {off:,.0f}, on {on:,.0f} (x{on / off:.2f})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delays", default="0.002,0.005", help="per-sample delays in seconds (comma-separated)")
    ap.add_argument("--workers", default="0,2", help="num_workers values (comma-separated)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", help="also write the rows as JSON here")
    a = ap.parse_args(argv)
    results = []
    with tempfile.TemporaryDirectory(prefix="ddpd_bench_") as tmp:
        for delay in [float(x) for x in a.delays.split(",") if x]:
            for workers in [int(x) for x in a.workers.split(",") if x]:
                results.append(run_one(delay, workers, a.steps, Path(tmp)))
    batch = 8
    print(f"data wait per training step (2 ranks, batch {batch}, {a.steps} steps, {os.cpu_count()} CPUs)")
    hdr = (f"{'delay/sample':>12} {'workers':>7} {'rank':>4} {'injected':>9} {'in getitem':>10} "
           f"{'stopwatch':>9} {'ddp-doctor':>10} {'error':>7}  findings")
    print(hdr)
    print("-" * len(hdr))
    worst = 0.0
    for res in results:
        for row in res["rows"]:
            injected = batch * res["delay"] if res["workers"] == 0 else None
            m, sw = row["measured"], row["stopwatch"]
            err = None if m is None or sw <= 0 else (m - sw) / sw
            if err is not None and sw >= 0.005:
                worst = max(worst, abs(err))
            gi = f"{row['getitem'] * 1000:.1f}ms" if res["workers"] == 0 else "-"
            print(f"{res['delay'] * 1000:>10.1f}ms {res['workers']:>7} {row['rank']:>4} "
                  f"{'-' if injected is None else f'{injected * 1000:.1f}ms':>9} "
                  f"{gi:>10} "
                  f"{sw * 1000:>7.1f}ms {'-' if m is None else f'{m * 1000:.1f}ms':>10} "
                  f"{'-' if err is None else f'{err:+.1%}':>7}  {','.join(row['codes']) or '-'}")
    print()
    print("injected = batch x delay (num_workers=0 only); in getitem = time the dataset really spent per batch "
          "(main process, num_workers=0); stopwatch = the training loop's own timing of next(); "
          "error = ddp-doctor vs stopwatch.")
    print(f"largest |error| where the wait is >= 5 ms per step: {worst:.1%}")
    print(prefetcher_line())
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
