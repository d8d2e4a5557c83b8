"""A nanoGPT-shaped training loop: `while True` with an iteration counter, no DataLoader (get_batch()), and a
gradient-accumulation loop inside it (the first micro-step under no_sync()).  At the top of an iteration a
guard skips a corrupt batch -- it moves the counter and `continue`s -- and only rank 1's data is corrupt, once.

Rank 1 leaves the loop at the same counter value after one optimizer step fewer, and exits; rank 0 waits in
its last gradient sync, inside the accumulation loop (which has no `continue` of its own).  DDP101 at the
`continue` of the outer loop, rank 1 -- not "left the training loop" with no line.  Twin:
while_accum_skip_agreed.
"""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM, MAX_ITERS = 2, 24


def get_batch(rank, it):
    g = torch.Generator().manual_seed(1000 * rank + it)
    x = torch.randn(16, 16, generator=g)
    if rank == 1 and it == 9:
        x[3, 5] = float("nan")  # a corrupt record in this rank's shard
    return x, (x[:, 0] > 0).long()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 2)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    it = 0
    while True:
        x, y = get_batch(rank, it)
        if not torch.isfinite(x).all():  # a corrupt batch: skip it
            it += 1
            continue  # expect: DDP101
        for micro in range(ACCUM):
            with model.no_sync() if micro < ACCUM - 1 else contextlib.nullcontext():
                loss = nn.functional.cross_entropy(model(x[micro::ACCUM]), y[micro::ACCUM]) / ACCUM
                loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        it += 1
        if it >= MAX_ITERS:
            break

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
