"""Rank-local filtering done right: filter up front, agree on the number of batches (clean twin).

Twin of uneven_filter_continue.py: each rank drops its rejected samples before
building the loader (so shards have different lengths), then the ranks agree
on the smallest number of batches with one all_reduce(MIN) and every rank runs
exactly that many steps.
"""
import datetime
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset


def make_dataset(n=128):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, 0] > 0).long()
    quality = 0.2 + 0.8 * torch.rand(n, generator=g)
    quality[49:64:2] = 0.0
    return TensorDataset(x, y, quality)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = make_dataset()
    mine = list(DistributedSampler(dataset, shuffle=False))
    kept = Subset(dataset, [i for i in mine if dataset[i][2] > 0.1])
    loader = DataLoader(kept, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(rank))

    n_batches = torch.tensor([len(loader)])
    dist.all_reduce(n_batches, op=dist.ReduceOp.MIN)  # every rank runs the same number of steps
    n_batches = int(n_batches.item())

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        for xb, yb, _ in itertools.islice(loader, n_batches):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch}: {n_batches} steps of {len(loader)}, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
