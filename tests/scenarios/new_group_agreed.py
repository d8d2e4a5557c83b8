"""Twin of new_group_rank_args: the evaluation group's members are agreed before `new_group()`.

Every rank all-gathers the shard sizes first, so every rank computes the same member
list and calls `new_group(members)` with the same arguments, members or not.  A second
group of the same ranks is created with `use_local_synchronization=True`, which only its
members call (torch allows that, and names it by its ranks, not by a count).
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
    n_val = 50 if rank == 0 else 0  # this rank's validation shard

    sizes = [None] * world
    dist.all_gather_object(sizes, n_val)
    members = [r for r in range(world) if sizes[r] > 0]
    eval_group = dist.new_group(members, timeout=timeout)
    report_group = None
    if rank in members:
        report_group = dist.new_group(members, timeout=timeout, use_local_synchronization=True)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        loss = model(torch.randn(16, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank in members:
        val = torch.tensor([float(n_val)])
        dist.all_reduce(val, group=eval_group)
        dist.barrier(group=report_group)
        print(f"rank {rank}: {val.item():.0f} validation samples in the eval group", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
