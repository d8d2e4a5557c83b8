"""`new_group()` called by its members only (DDP201 on rank 0, at that call): ranks call new_group different numbers of times.

Rank 0 alone evaluates, so the script creates the evaluation group "where it is
needed" — under `if rank in eval_ranks:` — without `use_local_synchronization=True`.
torch names groups by a count of `new_group` calls that every rank must make: the next
group, created by every rank for logging, is the 2nd group on rank 0 but the 1st on
rank 1, so the two ranks mean different groups by one name and wait in its set-up for
each other.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90)))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    eval_ranks = [0]

    eval_group = None
    if rank in eval_ranks:  # expect: DDP201
        eval_group = dist.new_group(eval_ranks, timeout=timeout)
    log_group = dist.new_group(list(range(world)), timeout=timeout)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        loss = model(torch.randn(16, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 5 == 4:
            t = loss.detach().reshape(1)
            dist.all_reduce(t, group=log_group)
            if rank == 0:
                print(f"step {step} mean loss {t.item() / world:.4f}", flush=True)
    if eval_group is not None:
        dist.barrier(group=eval_group)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
