"""Early stopping agreed by all_reduce: all ranks stop at the same epoch (clean twin).

Twin of uneven_early_stop.py: same rank-local validation shards, but the stop
flag is all-reduced (MAX) so the ranks leave the loop together.
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

    x = torch.randn(192, 16)
    y = (x[:, 0] > 0).long()
    train_set = TensorDataset(x[:128], y[:128])
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    xv = x[128 + 32 * rank:160 + 32 * rank]
    yv = (xv[:, 0] > 0).long() if rank == 0 else torch.randint(0, 2, (32,), generator=torch.Generator().manual_seed(1))

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.2)
    loss_fn = nn.CrossEntropyLoss()

    best, patience, bad_epochs = float("inf"), 1, 0
    for epoch in range(10):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
        with torch.no_grad():
            val_loss = loss_fn(model.module(xv), yv).item()
        if val_loss < best - 1e-3:
            best, bad_epochs = val_loss, 0
        else:
            bad_epochs += 1
        stop = torch.tensor([1.0 if bad_epochs > patience else 0.0])
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # stop together as soon as any rank wants to
        if stop.item() > 0:
            print(f"rank {rank}: early stopping at epoch {epoch}", flush=True)
            break

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
