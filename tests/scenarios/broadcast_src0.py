"""Rank 0 decides, every rank calls broadcast(src=0) (clean twin).

Twin of rank0_metric_allreduce.py: the collective itself is outside any rank
condition; only the *value* is computed on rank 0.  Also all-reduces a metric on
every rank for logging.
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

    # rank 0 picks the learning rate (e.g. from a sweep file); everyone receives it
    lr = torch.tensor([0.1 if rank == 0 else 0.0])
    dist.broadcast(lr, src=0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=lr.item())
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if step % 4 == 3:
                avg = loss.detach().clone()
                dist.all_reduce(avg)  # every rank, same point
                if rank == 0:
                    print(f"epoch {epoch} step {step} mean loss {avg.item() / dist.get_world_size():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
