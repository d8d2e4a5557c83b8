"""Overhead of `ddp-doctor run` vs plain torchrun (interleaved), on 2 gloo ranks (or NCCL on GPUs).

(a) a loop of 1-element all_reduce (per-collective cost); also TORCH_DISTRIBUTED_DEBUG=DETAIL on (a);
(b) a small DDP training loop (wall ratio); (c) an FSDP2 (`fully_shard`) training step, whose all-gathers
and reduce-scatters torch issues inside the model's forward and backward (the probe walks to the user's
frame).  Each job times its own loop (after a warm-up) on rank 0 and prints it, so start-up time (imports,
rendezvous) is excluded.  The defaults time several seconds per job
(the steady state a long job lives in) and alternate the variants, on a 2-core box where every stray
thread competes with the two ranks: compare the ratios of one run, not numbers across days.
``--backend nccl`` puts every rank on ``cuda:LOCAL_RANK`` (one GPU: ``--nproc 1``); NCCL returns before a
collective completes, so the loops end with a CUDA synchronize and (a) is the issue-and-complete rate.

    PYTHONPATH=src python benchmarks/overhead.py [--reps 5] [--n 5000] [--steps 2000]
    PYTHONPATH=src python benchmarks/overhead.py --backend nccl --nproc 1 --variants a_torchrun,a_doctor
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import textwrap

# both jobs: BENCH_BACKEND=gloo (CPU tensors) or nccl (cuda:LOCAL_RANK); sync() waits for queued GPU work
PRELUDE = """
import os, sys, time, torch, torch.distributed as dist
BACKEND = os.environ.get("BENCH_BACKEND", "gloo")
dev = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if BACKEND == "nccl" else torch.device("cpu")
if dev.type == "cuda":
    torch.cuda.set_device(dev)
def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()
dist.init_process_group(BACKEND)
"""

JOB_A = PRELUDE + """
t = torch.ones(1, device=dev)
n = int(sys.argv[1])
for _ in range(200):
    dist.all_reduce(t)
sync(); dist.barrier(); sync()
t0 = time.perf_counter()
for _ in range(n):
    dist.all_reduce(t)
sync()
dt = time.perf_counter() - t0
if dist.get_rank() == 0:
    print(f"RESULT {dt / n * 1e6:.2f}", flush=True)
dist.destroy_process_group()
"""

# (b) and (c): ms per step after the 20 warm-up steps, printed by rank 0
STEPS_DONE = """
sync()
dt = time.perf_counter() - t0
if dist.get_rank() == 0:
    print(f"RESULT {dt / (steps - 20) * 1e3:.3f}", flush=True)
dist.destroy_process_group()
"""

JOB_B = PRELUDE + """
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
torch.manual_seed(0)
steps = int(sys.argv[1])
ds = TensorDataset(torch.randn(steps * 16, 64), torch.randn(steps * 16, 1))
loader = DataLoader(ds, batch_size=16)
model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.BatchNorm1d(256), nn.Linear(256, 1)).to(dev),
            device_ids=[dev.index] if dev.type == "cuda" else None)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
t0 = None
for i, (x, y) in enumerate(loader):
    if i == 20:
        sync(); dist.barrier(); sync(); t0 = time.perf_counter()
    x, y = x.to(dev), y.to(dev)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
""" + STEPS_DONE

JOB_C = PRELUDE + """
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
torch.manual_seed(0)
steps = int(sys.argv[1])
mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
model = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.ReLU()) for _ in range(4)], nn.Linear(128, 1)).to(dev)
for block in model:
    fully_shard(block, mesh=mesh)
fully_shard(model, mesh=mesh)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
x, y = torch.randn(32, 128, device=dev), torch.randn(32, 1, device=dev)
t0 = None
for i in range(steps):
    if i == 20:
        sync(); dist.barrier(); sync(); t0 = time.perf_counter()
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad(); loss.backward(); opt.step()
""" + STEPS_DONE


VARIANTS = ("a_torchrun", "a_doctor", "a_detail", "b_torchrun", "b_doctor", "c_torchrun", "c_doctor")


def run(launcher: str, script: str, arg: int, env_extra: dict[str, str] | None = None, nproc: int = 2) -> float | None:
    env = dict(os.environ, **(env_extra or {}))
    pre = [sys.executable, "-m", "torch.distributed.run"] if launcher == "torchrun" else \
        [sys.executable, "-m", "ddp_doctor", "run", "--quiet", "--no-lint"]
    cmd = pre + ["--nproc-per-node", str(nproc), "--standalone", script, str(arg)]
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


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--n", type=int, default=5000, help="all_reduce calls timed per job (a)")
    ap.add_argument("--steps", type=int, default=2000, help="DDP steps per job (b); the first 20 are warm-up")
    ap.add_argument("--backend", choices=("gloo", "nccl"), default="gloo",
                    help="nccl: CUDA tensors on cuda:LOCAL_RANK (needs a GPU per rank)")
    ap.add_argument("--nproc", type=int, default=2, help="ranks per job")
    ap.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated subset of {','.join(VARIANTS)}")
    ap.add_argument("--micro-calls", type=int, default=100_000, help="calls timed in-process for the bookkeeping")
    ap.add_argument("--json", help="also write the medians and samples as JSON here")
    a = ap.parse_args(argv)
    chosen = [v for v in a.variants.split(",") if v]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown or a.steps <= 20:
        ap.error(f"unknown variants {unknown}" if unknown else "--steps must be above the 20 warm-up steps")
    d = tempfile.mkdtemp()
    sa, sb, sc = os.path.join(d, "allreduce.py"), os.path.join(d, "ddp.py"), os.path.join(d, "fsdp2.py")
    open(sa, "w").write(textwrap.dedent(JOB_A))
    open(sb, "w").write(textwrap.dedent(JOB_B))
    open(sc, "w").write(textwrap.dedent(JOB_C))
    backend = {"BENCH_BACKEND": a.backend}
    res: dict[str, list[float]] = {k: [] for k in VARIANTS}
    for _ in range(a.reps):  # interleaved, so load changes hit every variant alike
        for key, launcher, script, arg, env in (
                ("a_torchrun", "torchrun", sa, a.n, backend), ("a_doctor", "doctor", sa, a.n, backend),
                ("a_detail", "torchrun", sa, a.n, {**backend, "TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
                ("b_torchrun", "torchrun", sb, a.steps, backend), ("b_doctor", "doctor", sb, a.steps, backend),
                ("c_torchrun", "torchrun", sc, a.steps, backend), ("c_doctor", "doctor", sc, a.steps, backend)):
            if key not in chosen:
                continue
            v = run(launcher, script, arg, env, a.nproc)
            if v is not None:
                res[key].append(v)
    med = {k: statistics.median(v) if v else float("nan") for k, v in res.items()}
    print(f"backend {a.backend}, {a.nproc} rank(s) per job, {a.reps} round(s)")
    print(f"{'variant':<36}{'median':>12}  samples")
    print(f"{'(a) all_reduce, torchrun':<36}{med['a_torchrun']:>9.2f} us  {res['a_torchrun']}")
    print(f"{'(a) all_reduce, ddp-doctor run':<36}{med['a_doctor']:>9.2f} us  {res['a_doctor']}")
    print(f"{'(a) all_reduce, DEBUG=DETAIL':<36}{med['a_detail']:>9.2f} us  {res['a_detail']}")
    print(f"{'(b) DDP step, torchrun':<36}{med['b_torchrun']:>9.3f} ms  {res['b_torchrun']}")
    print(f"{'(b) DDP step, ddp-doctor run':<36}{med['b_doctor']:>9.3f} ms  {res['b_doctor']}")
    print(f"{'(c) FSDP2 step, torchrun':<36}{med['c_torchrun']:>9.3f} ms  {res['c_torchrun']}")
    print(f"{'(c) FSDP2 step, ddp-doctor run':<36}{med['c_doctor']:>9.3f} ms  {res['c_doctor']}")
    bare, wrapped = micro(a.micro_calls)
    print(f"{'probe bookkeeping per collective':<36}{wrapped - bare:>9.2f} us  (in-process, no-op collective)")
    print(f"\nadded per collective: {med['a_doctor'] - med['a_torchrun']:+.2f} us "
          f"(DETAIL: {med['a_detail'] - med['a_torchrun']:+.2f} us); "
          f"DDP step wall ratio: {med['b_doctor'] / med['b_torchrun']:.3f}x; "
          f"FSDP2 step wall ratio: {med['c_doctor'] / med['c_torchrun']:.3f}x")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"backend": a.backend, "nproc": a.nproc, "reps": a.reps, "n": a.n, "steps": a.steps,
                       "samples": {k: v for k, v in res.items() if k in chosen},
                       "median": {k: (None if v != v else v) for k, v in med.items() if k in chosen},
                       "bookkeeping_us": wrapped - bare,
                       "units": {"a": "us per all_reduce", "b": "ms per DDP step", "c": "ms per FSDP2 step"}},
                      f, indent=1)
    missing = [k for k in chosen if not res[k]]
    if missing:
        print(f"no result from: {', '.join(missing)} (a job failed)", file=sys.stderr)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
