"""Seed 002: a home-made data interface gives ranks different numbers of batches (DDP101).

"If you write your own data interface, make sure every card gets the same number
of batches, or the program gets stuck at the end of the first epoch."  Each rank
reads its own pre-split shard (no DistributedSampler); the shards were split by
file, so rank 0 has 100 samples and rank 1 has 90: 10 vs 9 batches per epoch.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

SHARD_SIZES = [100, 90]  # samples per shard file


class ShardDataset(Dataset):
    """The samples of one rank's shard (synthetic stand-in for reading shard-{rank}.pt)."""

    def __init__(self, rank):
        g = torch.Generator().manual_seed(rank)
        self.x = torch.randn(SHARD_SIZES[rank], 16, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    loader = DataLoader(ShardDataset(rank), batch_size=10, shuffle=True)  # expect: DDP101

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch}: {len(loader)} batches, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
