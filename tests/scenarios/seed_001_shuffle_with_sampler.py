"""Seed 001's "wrong" script as published: DataLoader(shuffle=True, sampler=DistributedSampler(...)) (crash at start).

The blog says shuffle=True next to a sampler "is ignored but misleading".  It is
not ignored: DataLoader raises ValueError("sampler option is mutually exclusive
with shuffle") on every rank before the first step.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class DummyDS(Dataset):
    def __init__(self, n=1003):  # deliberately not a multiple of world_size
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return torch.randn(16, generator=g), int(i % 10)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    ds = DummyDS()

    sampler = DistributedSampler(ds, shuffle=True, drop_last=False)
    loader = DataLoader(ds, batch_size=2, shuffle=True, sampler=sampler, num_workers=0)  # expect: DDP204

    model = DDP(nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
