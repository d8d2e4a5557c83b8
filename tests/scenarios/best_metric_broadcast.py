"""A rank-local "new best" decision guards an object broadcast (DDP201 at the `if`).

After each epoch every rank evaluates on its own validation shard and, when its own validation loss beats
the best so far, broadcasts the checkpoint name from rank 0 "so every rank loads the same best model".  The
loss is shard-local, so the ranks disagree about "new best": one rank enters `broadcast_object_list` while
the other is already in the next epoch's gradient all-reduce.
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
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    gen = torch.Generator().manual_seed(100 + rank)  # each rank's own validation shard
    val_x = torch.randn(64, 16, generator=gen) * (1.0 + rank)
    val_y = (val_x[:, 0] > 0).long()

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    best = float("inf")
    for epoch in range(4):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        with torch.no_grad():
            val_loss = nn.functional.cross_entropy(model.module(val_x), val_y).item()
        if val_loss < best - 0.05:  # expect: DDP201
            best = val_loss
            name = [f"best-epoch{epoch}.pt"]
            dist.broadcast_object_list(name, src=0)
        print(f"rank {rank} epoch {epoch} val {val_loss:.4f} best {best:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
