"""Seed 001's actual cause: a collate_fn that drops corrupt samples returns None, and the loop `continue`s (DDP101).

"Some custom collate_fn returns None for an empty batch and the loop just
continues."  Rank 1's shard contains a batch made only of corrupt records, so
rank 1 skips a step that rank 0 takes.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.dataloader import default_collate


class Records(Dataset):
    def __init__(self, n=128):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.corrupt = set(range(33, 48, 2))  # rank 1's 3rd batch (shuffle=False, batch 8)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i in self.corrupt:
            return None  # failed to decode
        return self.x[i], int(self.x[i, 0] > 0)


def collate_skip_none(batch):
    batch = [b for b in batch if b is not None]
    if not batch:
        return None
    return default_collate(batch)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    ds = Records()
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, collate_fn=collate_skip_none)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in loader:
            if batch is None:
                continue  # expect: DDP101
            x, y = batch
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
