"""all_gather of per-rank predictions whose length differs between ranks (DDP203).

The validation set (99 samples) is split by striding, so rank 0 evaluates 50
samples and rank 1 evaluates 49; `dist.all_gather` requires the same shape on
every rank.
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
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    x = torch.randn(355, 16)
    y = (x[:, 0] > 0).long()
    train_set = TensorDataset(x[:256], y[:256])
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    xv = x[256 + rank::world]  # 50 samples on rank 0, 49 on rank 1

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()

        with torch.no_grad():
            preds = model.module(xv).argmax(1)
        gathered = [torch.empty_like(preds) for _ in range(world)]
        dist.all_gather(gathered, preds)  # expect: DDP203
        if rank == 0:
            print(f"epoch {epoch} val acc {(torch.cat(gathered) == torch.cat([y[256::2], y[257::2]])).float().mean():.3f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
