"""Twin of while_accum_corrupt_skip: the same nanoGPT-shaped loop and the same corrupt record on rank 1, but
the ranks agree on the skip (an all-reduce of the flag, MAX) before acting, so every rank skips that
iteration and the job ends well.
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
        corrupt = torch.tensor(0.0 if torch.isfinite(x).all() else 1.0)
        dist.all_reduce(corrupt, op=dist.ReduceOp.MAX)  # skip together
        if corrupt.item() > 0:
            it += 1
            continue
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
