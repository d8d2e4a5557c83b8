"""The twin of best_metric_broadcast: the validation loss is averaged over the ranks before "new best" is
decided, so every rank takes the same way and makes the same broadcasts.
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
            val_loss = nn.functional.cross_entropy(model.module(val_x), val_y).reshape(1)
        dist.all_reduce(val_loss)
        val_loss = val_loss.item() / dist.get_world_size()
        if val_loss < best - 0.05:
            best = val_loss
            name = [f"best-epoch{epoch}.pt"]
            dist.broadcast_object_list(name, src=0)
        print(f"rank {rank} epoch {epoch} val {val_loss:.4f} best {best:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
