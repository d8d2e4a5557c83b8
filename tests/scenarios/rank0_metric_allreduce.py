"""A metric all_reduce only rank 0 calls (DDP201).

The loop averages the loss across ranks for logging, but the all_reduce sits
inside the `if rank == 0:` logging block.  Rank 0's all_reduce of one float is
matched by gloo against rank 1's next gradient all-reduce (a different size).
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

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if rank == 0 and step % 4 == 3:  # expect: DDP201
                avg = loss.detach().clone()
                dist.all_reduce(avg)
                print(f"epoch {epoch} step {step} mean loss {avg.item() / dist.get_world_size():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
