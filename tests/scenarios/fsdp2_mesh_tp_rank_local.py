"""FSDP2 on a 2-D DeviceMesh (4 ranks: "dp" x "tp"), a rank-local decision on the tp group (DDP201 at the `if`).

`fully_shard` shards the model over the "dp" dimension; each "tp" pair also averages an auxiliary loss
statistic over its own group.  The statistic is only exchanged `if aux > 0.5` - a value of the rank's own
batch - so one rank of a tp pair enters the all_reduce on the "tp" group while its partner goes on to the
next step's FSDP2 all-gather on the "dp" group.  The stall shows on both groups; the fault is the tp
group's rank-local `if`, and the finding names the mesh dimension.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(1000 + rank)  # this rank's own batches
    for step in range(10):
        x = torch.randn(8, 16, generator=gen)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        aux = x[:, 0].abs().mean()
        if aux > 0.8:  # expect: DDP201
            dist.all_reduce(aux.reshape(1), group=mesh.get_group("tp"))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
