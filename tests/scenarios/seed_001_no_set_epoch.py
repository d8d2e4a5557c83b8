"""Seed 001 minus its real bugs: drop_last=False on an odd-sized dataset and no set_epoch (DDP102, no hang).

The blog blames drop_last=False + a missing set_epoch for its "random hang at
the end of an epoch".  Neither hangs: DistributedSampler pads 1003 samples to
502 per rank, and without set_epoch every epoch just reuses the epoch-0
shuffle order (identical on all ranks, so no desync — only worse training).
The job exits 0; ddp-doctor should warn DDP102 and nothing worse.
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

    x = torch.randn(1003, 16)  # deliberately not a multiple of world_size
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, drop_last=False)  # expect: DDP102
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        first = None
        for xb, yb in loader:
            first = xb[0, 0].item() if first is None else first
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch}: {len(loader)} batches, first sample {first:.4f}, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
