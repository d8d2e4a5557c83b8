"""Gradient accumulation with DDP.no_sync(): 4 forwards/backwards per all-reduce (clean twin).

Forward/backward counts and gradient all-reduce counts differ on purpose
(3 of every 4 micro-steps skip the all-reduce), identically on every rank.
A detector comparing forwards to all-reduces, or counting "steps" as
all-reduces, must not report uneven steps or a forward on a subset of ranks.
"""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUM = 4


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(512, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        opt.zero_grad()
        for i, (xb, yb) in enumerate(loader):
            last_micro_step = (i + 1) % ACCUM == 0
            with contextlib.nullcontext() if last_micro_step else model.no_sync():
                loss = loss_fn(model(xb), yb) / ACCUM
                loss.backward()
            if last_micro_step:
                opt.step()
                opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * ACCUM:.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
