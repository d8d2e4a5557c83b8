"""A NaN loss on one rank `continue`s past backward inside `for step in range(40)` (DDP101 at the `continue`).

The loop runs 40 times on every rank: what differs is that rank 1 ran one DDP forward with no backward after it
(the probe counts it), so its gradient all-reduces run one short and its final all_reduce pairs with rank 0's
last gradient all-reduce.  The line to change is the `continue`, never the loop header.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(40):
        x = torch.randn(4, 8)
        if rank == 1 and step == 7:
            x[0, 0] = float("nan")  # one corrupt record in rank 1's data
        loss = model(x).pow(2).mean()
        if not torch.isfinite(loss):
            continue  # expect: DDP101
        opt.zero_grad()
        loss.backward()
        opt.step()
    done = torch.ones(1)
    dist.all_reduce(done)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
