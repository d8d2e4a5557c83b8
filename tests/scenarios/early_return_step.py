"""A `train_step()` helper returns early on a non-finite loss, on one rank only (DDP101 at the `return`).

One corrupt record lands in rank 1's shard; its loss is NaN, `train_step`
returns before backward and the optimizer step, so rank 1 runs one step fewer
per epoch than rank 0.  The gradient all-reduces are paired one step apart
until the epoch's end, where rank 0's extra step pairs with rank 1's next
epoch.  The line to change is the `return`, not `loss.backward()`.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def train_step(model, opt, xb, yb):
    opt.zero_grad()
    loss = nn.functional.cross_entropy(model(xb), yb)
    if not torch.isfinite(loss):
        return None  # expect: DDP101
    loss.backward()
    opt.step()
    return loss.item()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    x[81] = float("nan")  # with shuffle=False it lands in rank 1's 6th batch
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            train_step(model, opt, xb, yb)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
