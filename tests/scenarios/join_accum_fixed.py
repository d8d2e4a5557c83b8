"""Clean twin of join_accum_flush.py: gradient accumulation under DDP's `Join` over uneven per-rank
micro-batches with one schedule on every rank (`(i + 1) % accum == 0`); a rank's last partial window is
not flushed on its own, so no rank syncs while another is inside `no_sync()`."""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    batches = [(torch.randn(8, 16), torch.randint(0, 2, (8,))) for _ in range(21 + 6 * rank)]
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    accum = 4
    with Join([model]):
        for i, (x, y) in enumerate(batches):
            boundary = (i + 1) % accum == 0  # the same schedule on every rank
            ctx = contextlib.nullcontext() if boundary else model.no_sync()
            with ctx:
                loss = nn.functional.cross_entropy(model(x), y) / accum
                loss.backward()
            if boundary:
                opt.step()
                opt.zero_grad()
    print(f"rank {rank} done {len(batches)} micro-batches", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
