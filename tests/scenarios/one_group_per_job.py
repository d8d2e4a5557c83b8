"""Every process joins the launcher's one process group (clean twin of own_group_per_process.py).

init_process_group reads WORLD_SIZE / RANK from the launcher: 2 processes form
one group of world size 2, DistributedSampler splits the data between them and
DDP averages their gradients.  Must be reported clean, with no DDP510.
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
    dist.init_process_group("gloo", timeout=timeout)
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
