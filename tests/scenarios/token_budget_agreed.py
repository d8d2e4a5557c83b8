"""Twin of token_budget_no_sync: the token budget is counted over all ranks (an all_reduce of each
micro-batch's token count), so every rank leaves `model.no_sync()` at the same micro-step.  Clean."""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

TOKEN_BUDGET = 192


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Embedding(64, 16), nn.Flatten(), nn.Linear(16 * 12, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(10 + rank)  # this rank's shard of the corpus
    tokens_seen = 0
    for micro_step in range(48):
        ids = torch.randint(1, 64, (4, 12), generator=gen)
        lengths = torch.randint(3, 13, (4,), generator=gen)
        mask = torch.arange(12)[None, :] < lengths[:, None]
        ids = ids * mask  # padding is token 0
        count = mask.sum().reshape(1)
        dist.all_reduce(count)  # every rank counts the same tokens: the whole micro-batch's
        tokens_seen += int(count)
        sync_now = tokens_seen >= TOKEN_BUDGET
        ctx = contextlib.nullcontext() if sync_now else model.no_sync()
        with ctx:
            loss = nn.functional.cross_entropy(model(ids), (ids[:, 0] % 2))
            loss.backward()
        if sync_now:
            opt.step()
            opt.zero_grad()
            tokens_seen = 0
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
