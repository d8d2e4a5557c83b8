"""Twin of range_nan_skip: the ranks agree on the skip (an all_reduce of the flag) before anyone skips backward."""
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
            x[0, 0] = float("nan")
        loss = model(x).pow(2).mean()
        bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        if bad.item() > 0:
            continue  # every rank skips this step together
        opt.zero_grad()
        loss.backward()
        opt.step()
    done = torch.ones(1)
    dist.all_reduce(done)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
