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

Then it measures ddp_doctor.fixes.CUDAPrefetcher on/off samples/s on a loader-bound loop (the loader
alone, the loop with ``.to(device)``, the loop with the prefetcher) on ``--device``: CUDA where
available; on a CPU-only machine it says that this was not measured, and ``--device cpu`` runs the same
loop on the CPU (the prefetcher is a pass-through there: a check of the script, not a GPU figure).
``--prefetch-only`` skips the data-wait sweep (which is a CPU gloo job whatever ``--device`` says).

    PYTHONPATH=src python benchmarks/data_wait.py --device cuda --prefetch-only --json out.json
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
from dataclasses import asdict, dataclass
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


@dataclass(frozen=True)
class PrefetchRates:
    """Samples/s of one loader-bound loop three ways: the loader alone, with ``.to(device)``, with the prefetcher."""

    device: str
    device_name: str
    samples: int
    batch: int
    workers: int
    epochs: int
    loader_only: float
    off: float
    on: float

    def line(self) -> str:
        where = self.device_name if self.device.startswith("cuda") else \
            "device cpu: CUDAPrefetcher is a pass-through here, a check of the script, not a GPU figure"
        return (f"CUDAPrefetcher samples/s ({where}; batch {self.batch}, {self.workers} workers, "
                f"{self.epochs} passes over {self.samples} samples): "
                f"loader alone {self.loader_only:,.0f}, off {self.off:,.0f}, on {self.on:,.0f} "
                f"(x{self.on / self.off:.2f})")


def prefetch_rates(device: str, samples: int = 4096, side: int = 64, batch: int = 256,
                   workers: int = 2, epochs: int = 3) -> PrefetchRates:
    """The loop: ``epochs`` passes over ``samples`` 3 x side x side images collated by ``workers`` (persistent)
    loader processes into pinned memory, one small MLP forward/backward per batch.  Timed from the second
    batch (worker start-up out)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ddp_doctor.fixes import CUDAPrefetcher

    dev = torch.device(device)
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    ds = TensorDataset(torch.randn(samples, 3, side, side), torch.randint(0, 10, (samples,)))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * side * side, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 10)).to(dev)

    def rate(mode: str) -> float:
        loader = DataLoader(ds, batch_size=batch, pin_memory=cuda, num_workers=workers,
                            persistent_workers=workers > 0)

        def batches():
            for _ in range(epochs):
                if mode == "on":
                    yield from CUDAPrefetcher(loader, dev)
                elif mode == "off":
                    yield from ((x.to(dev), y.to(dev)) for x, y in loader)
                else:
                    yield from loader

        n, t = 0, None
        for i, (x, y) in enumerate(batches()):
            if mode != "loader":
                model(x).sum().backward()
            if i == 0:
                sync()
                t = time.perf_counter()
            else:
                n += len(x)
        sync()
        return n / (time.perf_counter() - t)

    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    return PrefetchRates(str(dev), name, samples, batch, workers, epochs, rate("loader"), rate("off"), rate("on"))


def prefetcher_line(device: str | None, **sizes) -> tuple[str, PrefetchRates | None]:
    """The prefetcher's line of the output, and its rates where it was measured."""
    try:
        import torch
    except ImportError:
        return "CUDAPrefetcher on/off: not measured (torch not installed)", None
    if device is None and not torch.cuda.is_available():
        return "CUDAPrefetcher on/off samples/s: not measured (no CUDA device on this machine)", None
    r = prefetch_rates(device or "cuda", **sizes)
    return r.line(), r


def sweep(delays: str, workers_list: str, steps: int) -> list[dict]:
    """The data-wait table: one 2-rank gloo job per (delay, num_workers), printed."""
    results = []
    with tempfile.TemporaryDirectory(prefix="ddpd_bench_") as tmp:
        for delay in [float(x) for x in delays.split(",") if x]:
            for workers in [int(x) for x in workers_list.split(",") if x]:
                results.append(run_one(delay, workers, steps, Path(tmp)))
    batch = 8
    print(f"data wait per training step (2 ranks, batch {batch}, {steps} steps, {os.cpu_count()} CPUs)")
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
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--delays", default="0.002,0.005", help="per-sample delays in seconds (comma-separated)")
    ap.add_argument("--workers", default="0,2", help="num_workers values (comma-separated)")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--json", help="also write the rows (and the prefetcher's rates) as JSON here")
    ap.add_argument("--device", help="where the CUDAPrefetcher loop runs: cuda[:N] or cpu "
                    "(default: cuda where available, else not measured)")
    ap.add_argument("--prefetch-only", action="store_true", help="skip the data-wait sweep")
    ap.add_argument("--prefetch-samples", type=int, default=4096)
    ap.add_argument("--prefetch-side", type=int, default=64, help="images are 3 x side x side")
    ap.add_argument("--prefetch-batch", type=int, default=256)
    ap.add_argument("--prefetch-workers", type=int, default=2)
    ap.add_argument("--prefetch-epochs", type=int, default=3)
    a = ap.parse_args(argv)
    if a.device and a.device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            ap.error(f"--device {a.device}: no CUDA device here")
    results = [] if a.prefetch_only else sweep(a.delays, a.workers, a.steps)
    line, r = prefetcher_line(a.device, samples=a.prefetch_samples, side=a.prefetch_side, batch=a.prefetch_batch,
                              workers=a.prefetch_workers, epochs=a.prefetch_epochs)
    print(line)
    if a.json:
        Path(a.json).write_text(json.dumps({"rows": results, "prefetch": asdict(r) if r else None}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
