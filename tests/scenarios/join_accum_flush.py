"""Gradient accumulation under DDP's `Join` over uneven per-rank micro-batches, flushing the last partial
window at the end of each rank's own data.

Rank 0 has 21 micro-batches, rank 1 27.  `i + 1 == len(batches)` makes rank 0 sync after micro-batch 21
while rank 1, at its 21st, is still inside `no_sync()`: rank 0's gradient all-reduce meets rank 1's next
forward's small all-reduce and gloo aborts.  The decision is the choice of `no_sync()`, which reads each
rank's own `len(batches)` (clean twin: join_accum_fixed.py).
"""
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
            boundary = (i + 1) % accum == 0 or i + 1 == len(batches)
            ctx = contextlib.nullcontext() if boundary else model.no_sync()  # expect: DDP204
            with ctx:
                loss = nn.functional.cross_entropy(model(x), y) / accum  # expect: DDP204 (on a loaded box, when the killed rank last posted before the ranks parted)
                loss.backward()
            if boundary:
                opt.step()
                opt.zero_grad()
    print(f"rank {rank} done {len(batches)} micro-batches", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
