"""Clean twin of step_method_nan_return.py: the NaN check is agreed by all_reduce(MAX) before the early
`return`, so every rank skips the same steps."""
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
        bad = torch.tensor([float(math.isnan(loss.item()))])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # every rank skips the step when any rank's loss is NaN
        if bad.item() > 0:
            return None
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
