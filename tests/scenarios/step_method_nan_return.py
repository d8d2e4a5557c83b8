"""A Fabric-style loop object whose `step()` returns early when the loss is NaN, before backward (clean twin:
step_method_nan_agreed.py).

One NaN record lands in rank 0's shard: rank 0 runs the DDP forward and no backward for that batch, so its
gradient all-reduces pair with rank 1's of the next step until rank 0 finishes one step early and rank 1
waits alone.  The line to change is the `return` (the test reads `loss.item()` through `math.isnan`).
"""
import datetime
import math
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Loop:
    def __init__(self, model, opt):
        self.model, self.opt = model, opt
        self.global_step = 0

    def step(self, batch):
        x, y = batch
        loss = nn.functional.cross_entropy(self.model(x), y)
        if math.isnan(loss.item()):
            return None  # expect: DDP101
        self.opt.zero_grad()
        loss.backward()
        self.opt.step()
        self.global_step += 1
        return loss.item()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    x[70] = float("nan")  # with shuffle=False it lands in rank 0's shard
    dataset = TensorDataset(x, torch.randint(0, 2, (256,)))
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    loop = Loop(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in loader:
            loop.step(batch)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
