"""Rank 0 evaluates through the DDP model itself, like nanoGPT's estimate_loss (clean: no buffers).

The model has no buffers (LayerNorm, Linear), so a DDP forward under no_grad
issues no collective: rank 0's evaluation through `model` pairs with nothing
and the job is correct.  (With BatchNorm it would hang: seed_000_val_rank0_bn.)
With FAIL_AT set, rank 1 raises in its data pipeline at that step: the report
must blame that raise, not rank 0's harmless evaluation forwards.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

FAIL_AT = int(os.environ.get("FAIL_AT", -1))


def get_batch(step, rank):
    if rank == 1 and step == FAIL_AT:
        raise ValueError(f"corrupt record in shard {rank} at step {step}")
    g = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(16, 16, generator=g)
    return x, (x[:, 0] > 0).long()


@torch.no_grad()
def estimate_loss(model, rank):
    model.eval()
    losses = [nn.functional.cross_entropy(model(x), y).item() for x, y in (get_batch(10_000 + k, rank) for k in range(8))]
    model.train()
    return sum(losses) / len(losses)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, 2)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)

    for step in range(60):
        if step % 20 == 0 and rank == 0:
            print(f"step {step}: val loss {estimate_loss(model, rank):.4f}", flush=True)
        x, y = get_batch(step, rank)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
