"""Healthy 2-rank DDP job: DataLoader + DistributedSampler + set_epoch, BatchNorm, rank-0 print."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 2
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    ds = TensorDataset(torch.randn(256, 8), torch.randn(256, 1))
    sampler = DistributedSampler(ds)
    loader = DataLoader(ds, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
