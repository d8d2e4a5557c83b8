"""One slow rank: every all-reduce waits for rank 1 (DDP404).

Rank 1 stands for a GPU that is thermally throttled / shares its node with
another job: its forward+backward take 25 ms longer than rank 0's on every step.
The job finishes correctly; rank 0 spends that time waiting inside the gradient
all-reduce.  Same model and data as balanced.py.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(nn.Module):
    def __init__(self, slow_s):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2))
        self.slow_s = slow_s

    def forward(self, x):
        if self.slow_s:
            time.sleep(self.slow_s)  # the slow device: extra compute time on this rank only
        return self.layers(x)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    slow_rank, extra_s = 1, float(os.environ.get("STRAGGLER_EXTRA_S", 0.025))

    x = torch.randn(1024, 64)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(Net(extra_s if rank == slow_rank else 0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
