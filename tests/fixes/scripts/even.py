"""2-rank DDP training with rank-local filtering / uneven data; --fix wraps the loader in EvenBatches."""
import argparse
import datetime
import json

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from ddp_doctor.fixes import EvenBatches

p = argparse.ArgumentParser()
p.add_argument("--data", choices=["filter", "iterable", "shards"], default="filter")
p.add_argument("--fix", choices=["none", "min", "max"], default="none")
p.add_argument("--sync", default="auto")
a = p.parse_args()

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=4))
rank = dist.get_rank()
torch.manual_seed(0)


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.full((4,), float(i)), torch.tensor(0.0), torch.tensor(False)


if a.data == "filter":
    n = 64
    bad = torch.zeros(n, dtype=torch.bool)
    bad[[1, 9, 17]] = True  # samples of rank 1 (DistributedSampler: i % 2), one in each of its first 3 batches
    ds = TensorDataset(torch.randn(n, 4), torch.randn(n), bad)
    loader = DataLoader(ds, batch_size=4, sampler=DistributedSampler(ds, shuffle=False))
elif a.data == "iterable":
    loader = DataLoader(Stream(32 if rank == 0 else 20), batch_size=4)
else:  # per-rank shards of different sizes, map-style
    m = 32 if rank == 0 else 20
    loader = DataLoader(TensorDataset(torch.randn(m, 4), torch.randn(m), torch.zeros(m, dtype=torch.bool)), batch_size=4)

model = DDP(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
keep = (lambda b: not bool(b[2].any()))
wrapped = EvenBatches(loader, a.fix, keep=keep if a.data == "filter" else None, sync=a.sync) if a.fix != "none" else None
steps_by_epoch = []
for epoch in range(2):
    if hasattr(loader, "sampler") and isinstance(loader.sampler, DistributedSampler):
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
t = torch.tensor([psum])
dist.all_reduce(t)
print("RESULT", rank, json.dumps({"steps": steps_by_epoch, "psum": psum, "psum_mean": float(t) / 2,
                                  "sync": wrapped.sync if wrapped else None,
                                  "last": wrapped.last_epoch if wrapped else None}), flush=True)
dist.destroy_process_group()
