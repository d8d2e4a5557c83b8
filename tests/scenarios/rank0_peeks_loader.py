"""Rank 0 alone draws batches from the training loader to log them (clean: not a training step).

Before training, rank 0 logs the shape of `next(iter(train_loader))`; after
each epoch it shows a few sample predictions on training batches through
`model.module` under no_grad.  Neither is a training step: no DDP forward, no
gradient sync, no optimizer step.  Every rank runs the same number of steps.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    train_loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    if rank == 0:
        xb, yb = next(iter(train_loader))
        print(f"batch shapes: {tuple(xb.shape)} {tuple(yb.shape)}", flush=True)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in train_loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        if rank == 0:
            with torch.no_grad():
                for i, (xb, yb) in enumerate(train_loader):
                    if i == 3:
                        break
                    pred = model.module(xb).argmax(1)
                    print(f"epoch {epoch} sample {i}: {pred[:4].tolist()} vs {yb[:4].tolist()}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
