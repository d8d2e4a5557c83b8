"""Overhead of `ddp-doctor run` vs plain torchrun (interleaved), on 2 gloo ranks.

(a) a loop of 1-element all_reduce (per-collective cost); also TORCH_DISTRIBUTED_DEBUG=DETAIL on (a);
(b) a small DDP training loop (wall ratio).  Each job times its own loop (after a warm-up) on rank 0 and
prints it, so start-up time (imports, rendezvous) is excluded.  The defaults time several seconds per job
(the steady state a long job lives in) and alternate the variants, on a 2-core box where every stray
thread competes with the two ranks: compare the ratios of one run, not numbers across days.

    PYTHONPATH=src python benchmarks/overhead.py [--reps 5] [--n 5000] [--steps 2000]
"""
from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap

JOB_A = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")
t = torch.ones(1)
n = int(sys.argv[1])
for _ in range(200):
    dist.all_reduce(t)
dist.barrier()
t0 = time.perf_counter()
for _ in range(n):
    dist.all_reduce(t)
dt = time.perf_counter() - t0
if dist.get_rank() == 0:
    print(f"RESULT {dt / n * 1e6:.2f}", flush=True)
dist.destroy_process_group()
"""

JOB_B = """
import sys, time, torch, torch.distributed as dist, torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
dist.init_process_group("gloo")
torch.manual_seed(0)
steps = int(sys.argv[1])
ds = TensorDataset(torch.randn(steps * 16, 64), torch.randn(steps * 16, 1))
loader = DataLoader(ds, batch_size=16)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.BatchNorm1d(256), nn.Linear(256, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
t0 = None
for i, (x, y) in enumerate(loader):
    if i == 20:
        dist.barrier(); t0 = time.perf_counter()
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
dt = time.perf_counter() - t0
if dist.get_rank() == 0:
    print(f"RESULT {dt / (steps - 20) * 1e3:.3f}", flush=True)
dist.destroy_process_group()
"""


def run(launcher: str, script: str, arg: int, env_extra: dict[str, str] | None = None) -> float | None:
    env = dict(os.environ, **(env_extra or {}))
    pre = [sys.executable, "-m", "torch.distributed.run"] if launcher == "torchrun" else \
        [sys.executable, "-m", "ddp_doctor", "run", "--quiet", "--no-lint"]
    cmd = pre + ["--nproc-per-node", "2", "--standalone", script, str(arg)]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    m = re.search(r"RESULT ([0-9.]+)", p.stdout + p.stderr)
    return float(m.group(1)) if m else None


def micro(n: int = 100_000) -> tuple[float, float]:
    """In-process: a no-op 'collective' wrapped by the probe vs unwrapped (pure bookkeeping cost, us/call)."""
    import time

    import torch

    from ddp_doctor.probe import hooks
    from ddp_doctor.probe.recorder import Recorder

    hooks.REC = Recorder()

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    wrapped = hooks._wrap_collective(all_reduce, "all_reduce")
    t = torch.ones(1)
    out = []
    for fn in (all_reduce, wrapped):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(t)
        out.append((time.perf_counter() - t0) / n * 1e6)
    return out[0], out[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--steps", type=int, default=2000)
    a = ap.parse_args()
    d = tempfile.mkdtemp()
    sa, sb = os.path.join(d, "allreduce.py"), os.path.join(d, "ddp.py")
    open(sa, "w").write(textwrap.dedent(JOB_A))
    open(sb, "w").write(textwrap.dedent(JOB_B))
    res: dict[str, list[float]] = {k: [] for k in ("a_torchrun", "a_doctor", "a_detail", "b_torchrun", "b_doctor")}
    for _ in range(a.reps):  # interleaved, so load changes hit every variant alike
        for key, launcher, script, arg, env in (
                ("a_torchrun", "torchrun", sa, a.n, None), ("a_doctor", "doctor", sa, a.n, None),
                ("a_detail", "torchrun", sa, a.n, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
                ("b_torchrun", "torchrun", sb, a.steps, None), ("b_doctor", "doctor", sb, a.steps, None)):
            v = run(launcher, script, arg, env)
            if v is not None:
                res[key].append(v)
    med = {k: statistics.median(v) if v else float("nan") for k, v in res.items()}
    print(f"{'variant':<36}{'median':>12}  samples")
    print(f"{'(a) all_reduce, torchrun':<36}{med['a_torchrun']:>9.2f} us  {res['a_torchrun']}")
    print(f"{'(a) all_reduce, ddp-doctor run':<36}{med['a_doctor']:>9.2f} us  {res['a_doctor']}")
    print(f"{'(a) all_reduce, DEBUG=DETAIL':<36}{med['a_detail']:>9.2f} us  {res['a_detail']}")
    print(f"{'(b) DDP step, torchrun':<36}{med['b_torchrun']:>9.3f} ms  {res['b_torchrun']}")
    print(f"{'(b) DDP step, ddp-doctor run':<36}{med['b_doctor']:>9.3f} ms  {res['b_doctor']}")
    bare, wrapped = micro()
    print(f"{'probe bookkeeping per collective':<36}{wrapped - bare:>9.2f} us  (in-process, no-op collective)")
    print(f"\nadded per collective: {med['a_doctor'] - med['a_torchrun']:+.2f} us "
          f"(DETAIL: {med['a_detail'] - med['a_torchrun']:+.2f} us); "
          f"DDP step wall ratio: {med['b_doctor'] / med['b_torchrun']:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
