"""A scoring pass through an FSDP2 (`fully_shard`) model where the ranks run different numbers of
micro-batches (DDP201).

Each rank scores its own shard of the evaluation set in micro-batches; the shards differ in length, so
rank 0 runs one micro-batch more.  Every forward of the sharded model all-gathers its parameters from
every rank: rank 0's extra forward meets rank 1's all_reduce of the scores.  Plain torchrun: gloo aborts
one rank and the other dies on "Connection reset by peer".
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def score(model, shard, micro=4):
    total = torch.zeros(1)
    with torch.no_grad():
        for i in range(0, len(shard), micro):
            total += model(shard[i:i + micro]).pow(2).sum()  # expect: DDP201
    return total


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 2))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    shard = torch.randn(37, 16)[rank::world][: 16 + 3 * (rank == 0)]  # its own share: 19 rows vs 16
    total = score(model, shard)
    dist.all_reduce(total)
    if rank == 0:
        print(f"score {total.item():.3f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
