"""A seed broadcast whose `src` is each rank's own LOCAL_RANK (a typo carried over from a one-process script).

Every rank calls `dist.broadcast` at the same line, but each names itself as the source: torch requires one
root for all, so both ranks send and none receives, and the job hangs silently until the process-group
timeout -- it looks like a stuck transport.  The line to change is the broadcast's `src` (clean twin:
broadcast_src0.py).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def sync_seed(seed):
    t = torch.tensor([seed])
    dist.broadcast(t, src=int(os.environ["LOCAL_RANK"]))  # expect: DDP203
    return int(t.item())


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(sync_seed(1234 + rank))
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(30):
        x, y = torch.randn(8, 16), torch.randint(0, 2, (8,))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
