"""2-rank DDP training with rank-local filtering / uneven data, per case DATA:FIX (FIX none|min|max: EvenBatches mode)."""
import argparse
import datetime
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from ddp_doctor.fixes import EvenBatches

p = argparse.ArgumentParser()
p.add_argument("cases", nargs="+", help="DATA:FIX[:SYNC] with DATA filter|iterable|shards, FIX none|min|max")
a = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((4,), float(i)), torch.tensor(0.0), torch.tensor(False)


def make_loader(data):
    if data == "filter":
        n = 64
        bad = torch.zeros(n, dtype=torch.bool)
        bad[[1, 9, 17]] = True  # samples of rank 1 (DistributedSampler: i % 2), one in each of its first 3 batches
        ds = TensorDataset(torch.randn(n, 4), torch.randn(n), bad)
        return DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=False))
    if data == "iterable":
        return DataLoader(Stream(32 if rank == 0 else 20), batch_size=4)
    m = 32 if rank == 0 else 20  # per-rank shards of different sizes, map-style
    return DataLoader(TensorDataset(torch.randn(m, 4), torch.randn(m), torch.zeros(m, dtype=torch.bool)), batch_size=4)


def run_case(data, fix, sync="auto"):
    torch.manual_seed(0)
    loader = make_loader(data)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    keep = (lambda b: not bool(b[2].any())) if data == "filter" else None
    wrapped = EvenBatches(loader, fix, keep=keep, sync=sync) if fix != "none" else None
    steps_by_epoch = []
    for epoch in range(2):
        if isinstance(getattr(loader, "sampler", None), DistributedSampler):
            loader.sampler.set_epoch(epoch)
        steps = 0
        for x, y, b in (wrapped if wrapped is not None else loader):
            if wrapped is None and b.any():
                continue  # the classic rank-local skip (DDP101)
            loss = (model(x).squeeze(1) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            steps += 1
        steps_by_epoch.append(steps)
    psum = float(sum(p.detach().sum() for p in model.parameters()))
    return {"steps": steps_by_epoch, "psum": psum, "sync": wrapped.sync if wrapped else None,
            "last": wrapped.last_epoch if wrapped else None}


results = {}
for case in a.cases:
    results[case] = run_case(*case.split(":"))
print("RESULT", rank, json.dumps(results), flush=True)
dist.destroy_process_group()
