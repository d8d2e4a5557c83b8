"""Rank-conditional point-to-point that is correct: rank 0 sends, rank 1 receives (clean twin).

`dist.send` under `if rank == 0:` and `dist.recv` under `else:` is the normal
way to use point-to-point ops: the calls are rank-conditional but matched.
A rank-conditional-collective check must not fire here.
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
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        # rank 0 hands its learning-rate decision to rank 1, point to point
        new_lr = torch.tensor([opt.param_groups[0]["lr"] * 0.5])
        if rank == 0:
            dist.send(new_lr, dst=1)
        else:
            dist.recv(new_lr, src=0)
        for g in opt.param_groups:
            g["lr"] = new_lr.item()
        print(f"rank {rank} epoch {epoch} lr {new_lr.item()}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
