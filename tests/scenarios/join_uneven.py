"""Uneven inputs handled with DDP's Join context manager, the documented fix (clean).

Rank 0 has 10 batches per epoch, rank 1 has 7.  `with model.join():` lets the
rank that runs out shadow the others' gradient all-reduces until every rank
is done, so the job is correct though the ranks run different numbers of steps.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(rank)

    n = 160 if rank == 0 else 112  # this rank's shard: 10 or 7 batches of 16
    x = torch.randn(n, 16)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(2):
        with model.join():
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
