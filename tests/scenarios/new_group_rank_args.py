"""`new_group()` called with rank-dependent ranks (DDP203 on both ranks, at the new_group line).

The script builds an evaluation group of "the ranks that hold validation data", but
each rank decides the member list from its *own* shard only: rank 0 (50 samples)
thinks both ranks evaluate and calls `new_group([0, 1])`, rank 1 (empty shard)
leaves itself out and calls `new_group([0])`.  torch names groups by how many
`new_group` calls came before, so both mean the same group with different members:
rank 0 waits in the group's set-up for rank 1, which never joins it.
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

    members = [r for r in range(world) if r != rank or n_val > 0]
    eval_group = dist.new_group(members, timeout=timeout)  # expect: DDP203

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
        print(f"rank {rank}: {val.item():.0f} validation samples in the eval group", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
