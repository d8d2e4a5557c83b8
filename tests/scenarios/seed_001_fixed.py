"""Seed 001's "fixed" script: sampler owns the shuffle, set_epoch every epoch, barrier at the end (clean twin).

Twin of seed_001_shuffle_with_sampler.py (and, for set_epoch, of
seed_001_no_set_epoch.py).  drop_last=True is the blog's choice; it is not what
made the difference (DistributedSampler pads when drop_last=False).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class DummyDS(Dataset):
    def __init__(self, n=1003):
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

    sampler = DistributedSampler(ds, shuffle=True, drop_last=True)
    loader = DataLoader(ds, batch_size=32, sampler=sampler, num_workers=0)

    model = DDP(nn.Linear(16, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} ok", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
