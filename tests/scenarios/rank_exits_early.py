"""A rank decides it has nothing to do and exits 0 while the others wait for it (DDP204).

Each rank picks its input shards by stride; with 1 shard file and 2 ranks,
rank 1 gets an empty list, prints a polite message and calls sys.exit(0)
right after init_process_group.  Rank 0 goes on into DDP's
constructor, which needs rank 1.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset

SHARDS = ["train-00000.pt"]  # the job was configured for more files than exist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    my_shards = SHARDS[rank::world]
    if not my_shards:
        print(f"rank {rank}: no shards assigned, nothing to do", flush=True)
        sys.exit(0)  # expect: DDP204

    x = torch.randn(128, 16)  # stands in for torch.load(my_shards[0])
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=16, shuffle=True)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
