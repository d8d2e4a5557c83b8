"""Every process initialises a process group of its own (world_size=1, rank=0 written into the script) (DDP510).

The init line was copied from a single-process example.  Launched with 2
processes, each one is rank 0 of a world of 1: DDP all-reduces with itself,
DistributedSampler gives each process the whole dataset, and both train the
same model side by side, twice the work for one process's result.  Nothing
fails (exit 0); the report must warn at the init_process_group line, naming the
world size each process saw (1) against the launcher's (2).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90)))
    dist.init_process_group("gloo", rank=0, world_size=1, timeout=timeout)  # expect: DDP510
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(512, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        print(f"rank {rank} of {dist.get_world_size()}: epoch {epoch} loss {loss.item():.4f} "
              f"({len(loader)} steps)", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
