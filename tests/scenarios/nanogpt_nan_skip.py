"""A nanoGPT-style loop (no DataLoader: get_batch(); micro-steps toggling DDP's gradient sync) that skips a
micro-step on a non-finite loss, on one rank only (DDP101 at the `continue`).

With 2 ranks nanoGPT's 2 accumulation steps become 1 per rank, so every micro-step syncs.  At iteration
30 rank 1's loss overflows and it skips the backward: its optimizer still steps (on its own gradients),
so step counts stay equal, but from then on its gradient all-reduces pair with rank 0's next ones, and at
the end rank 0 waits for an all-reduce rank 1 never makes.  The evidence: rank 1 ran a DDP forward that
prepared a gradient sync and then no backward (iteration 31).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

ACCUM = 1  # micro-steps per rank (nanoGPT divides its accumulation steps by the world size)


def get_batch(rank, it, micro):
    g = torch.Generator().manual_seed(10_000 * rank + 10 * it + micro)
    x = torch.randn(16, 16, generator=g)
    return x, (x[:, 0] > 0).long()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 2)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for it in range(60):
        for micro in range(ACCUM):
            model.require_backward_grad_sync = micro == ACCUM - 1
            x, y = get_batch(rank, it, micro)
            loss = nn.functional.cross_entropy(model(x), y) / ACCUM
            if rank == 1 and it == 30 and micro == ACCUM - 1:
                loss = loss * float("inf")  # an overflow in this rank's batch
            if not torch.isfinite(loss):
                continue  # expect: DDP101
            loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
