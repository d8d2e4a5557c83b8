"""A scoring pass through an FSDP2 (`fully_shard`) model over uneven per-rank shards, the micro-batch count
agreed first (clean twin of fsdp2_score_uneven): the ranks with fewer batches run the model on an empty
batch for the rest, so every rank runs every forward (and its all-gathers)."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def score(model, shard, micro=4):
    total = torch.zeros(1)
    n = torch.tensor([(len(shard) + micro - 1) // micro])
    dist.all_reduce(n, op=dist.ReduceOp.MAX)
    with torch.no_grad():
        for b in range(int(n)):
            total += model(shard[b * micro:(b + 1) * micro]).pow(2).sum()  # empty past this rank's data
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
