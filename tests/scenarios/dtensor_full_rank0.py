"""`DTensor.full_tensor()` on rank 0 only, to log a sharded weight (DDP201).

A DTensor sharded over a mesh holds one shard per rank; `full_tensor()` all-gathers the shards (a
functional collective torch issues inside it).  Rank 0 calls it alone to log the weight's norm while rank 1
goes on to the next step's all_reduce.  Plain torchrun: a hang until the process-group timeout.
"""
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard, distribute_tensor


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    weight = distribute_tensor(torch.randn(64, 16), mesh, [Shard(0)])
    for step in range(20):
        local = weight.to_local()
        grad = torch.randn_like(local)
        dist.all_reduce(grad)
        local.sub_(0.01 * grad / world)
        if step % 5 == 4 and rank == 0:  # expect: DDP201
            print(f"step {step}: |w| = {weight.full_tensor().norm():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
