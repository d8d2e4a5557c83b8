"""Benchmark ``ddp-doctor lint`` on the installed torch source tree, on a generated 500-file training
repository (cross-file imports, helpers, loaders, rank checks), and TorchFix on a part of torch.

    PYTHONPATH=src python benchmarks/lint_speed.py [--subset distributed] [--no-torchfix] [--repo-files 500]

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
import tempfile
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


_UTIL = """import torch.distributed as dist


def get_rank():
    return dist.get_rank() if dist.is_initialized() else 0


def is_main_process():
    return get_rank() == 0


def synchronize():
    if dist.is_initialized():
        dist.barrier()


def reduce_mean(t):
    dist.all_reduce(t)
    return t / dist.get_world_size()
"""
_DATA = """from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Files{i}(Dataset):
    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        with open(self.paths[i], "rb") as fh:
            return fh.read()


def build_loader_{i}(paths, batch_size):
    ds = Files{i}(paths)
    return DataLoader(ds, batch_size=batch_size, sampler=DistributedSampler(ds), num_workers=4,
                      persistent_workers=True)
"""
_ENGINE = """import torch

from ..utils.dist import is_main_process, reduce_mean, synchronize


def train_one_epoch_{i}(model, loader, optimizer):
    for step, (x, y) in enumerate(loader):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            loss = reduce_mean(loss.detach())
            if is_main_process():
                print(step, loss.item())
    synchronize()


@torch.no_grad()
def evaluate_{i}(model, loader):
    return sum(model(x).sum().item() for x, _ in loader)
"""
_MAIN = """import torch
from torch.nn.parallel import DistributedDataParallel as DDP

from proj.data.data_{i} import build_loader_{i}
from proj.engine.engine_{i} import evaluate_{i}, train_one_epoch_{i}
from proj.utils import dist as comm


def main_{i}(model, paths, epochs):
    torch.distributed.init_process_group("nccl")
    torch.cuda.set_device(comm.get_rank())
    model = DDP(model.cuda(), device_ids=[comm.get_rank()])
    loader = build_loader_{i}(paths, 32)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(epochs):
        loader.sampler.set_epoch(epoch)
        train_one_epoch_{i}(model, loader, optimizer)
        score = evaluate_{i}(model, loader)
        if comm.is_main_process():
            torch.save(model.module.state_dict(), f"ckpt_{{epoch}}.pt")
            print(score)
{hazard}"""
_PLAIN = """import math


def schedule_{i}(step, warmup=100, total=10_000):
    if step < warmup:
        return step / warmup
    return 0.5 * (1 + math.cos(math.pi * (step - warmup) / (total - warmup)))
"""


def make_repository(root: Path, n_files: int) -> Path:
    """A training repository of ``n_files`` Python files: per group of 4, a loader factory, an engine,
    an entry point importing both (absolute and relative imports) and a plain helper.  Every 10th entry
    point has a rank-0-only barrier through utils/dist.py (a cross-file DDP201)."""
    proj = root / "proj"
    for d in ("", "utils", "data", "engine", "scripts", "misc"):
        (proj / d).mkdir(parents=True, exist_ok=True)
        (proj / d / "__init__.py").write_text("")
    (proj / "utils" / "dist.py").write_text(_UTIL)
    written, i = 7, 0
    while written < n_files:
        for sub, text in (("data/data_{i}.py", _DATA), ("engine/engine_{i}.py", _ENGINE),
                          ("scripts/main_{i}.py", _MAIN), ("misc/schedule_{i}.py", _PLAIN)):
            if written >= n_files:
                break
            # every 10th entry point waits in a barrier (in utils/dist.py) on rank 0 only: DDP201
            hazard = "    if comm.is_main_process():\n        comm.synchronize()\n" if i % 10 == 0 else ""
            (proj / sub.format(i=i)).write_text(text.format(i=i, hazard=hazard))
            written += 1
        i += 1
    return proj


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


def report_whole(whole: dict) -> None:
    print(f"\nddp-doctor lint, whole torch tree: {whole['files']} files in {whole['wall']:.1f} s wall "
          f"({whole['cpu']:.1f} s CPU, one process) = {whole['files'] / whole['cpu']:.0f} files/s (CPU)")
    print(f"  findings: {whole['findings']} {dict(sorted(whole['by_code'].items()))}")
    print(f"  per-file errors: {len(whole['errors'])}, crashes: {len(whole['crashes'])}")
    for e in whole["errors"]:
        print(f"    {e.path}: {e.message}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--subset", default="distributed", help="sub-directory of torch for the TorchFix comparison")
    ap.add_argument("--no-torchfix", action="store_true")
    ap.add_argument("--repo-files", type=int, default=500, help="size of the generated repository")
    ap.add_argument("--only-repo", action="store_true", help="skip the torch tree")
    args = ap.parse_args(argv)

    tree = torch_tree()
    print(f"python {sys.version.split()[0]}, torch tree {tree}")
    if args.only_repo:
        args.no_torchfix = True
        whole = None
    else:
        whole = run_ddp_doctor(tree)
    if whole is not None:
        report_whole(whole)


    with tempfile.TemporaryDirectory() as tmp:
        repo = make_repository(Path(tmp), args.repo_files)
        syn = run_ddp_doctor(repo)
    print(f"\nddp-doctor lint, generated {syn['files']}-file training repository (cross-file): "
          f"{syn['wall']:.2f} s wall ({syn['cpu']:.2f} s CPU) = {syn['files'] / syn['cpu']:.0f} files/s (CPU)")
    print(f"  findings: {syn['findings']} {dict(sorted(syn['by_code'].items()))}, "
          f"per-file errors: {len(syn['errors'])}, crashes: {len(syn['crashes'])}")

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
