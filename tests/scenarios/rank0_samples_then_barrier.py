"""Rank 0 shows sample accuracy on the training loader at each epoch's end, then every rank meets at a barrier (clean).

A variant of rank0_peeks_loader in the shape users write it: rank 0 draws one batch before training to log
its shape, and after each epoch iterates the first batches of the *training* loader under no_grad through
`model.module`; then every rank calls `dist.barrier()`.  Rank 0's extra loader passes are no training
epochs, and the barrier pairs with the barrier: nothing differs that torch requires to agree.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def sample_accuracy(net, loader, batches=3):
    hits = seen = 0
    with torch.no_grad():
        for i, (xb, yb) in enumerate(loader):
            if i == batches:
                break
            hits += (net(xb).argmax(1) == yb).sum().item()
            seen += len(yb)
    return hits / seen


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(512, 16)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=1)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    if rank == 0:
        print("batch", tuple(next(iter(loader))[0].shape), flush=True)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch}: sample accuracy {sample_accuracy(model.module, loader):.2f}", flush=True)
        dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
