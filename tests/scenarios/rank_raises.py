"""A rank raises mid-training: a corrupt record in rank 1's shard (DDP204).

Rank 1's loader hits a record that fails to parse at its 6th batch and raises
ValueError; rank 0 is left waiting in the gradient all-reduce of that step.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Records(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.bad = {81}  # rank 1 (odd indices, shuffle=False), 6th batch of 8

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i in self.bad:
            raise ValueError(f"record {i}: truncated file, cannot decode")  # expect: DDP204
        return self.x[i], int(self.x[i, 0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    ds = Records()
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
