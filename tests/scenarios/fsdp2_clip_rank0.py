"""Rank 0 alone clips (to log the gradient norm of) an FSDP2 model's sharded gradients (DDP201).

`clip_grad_norm_` over DTensor gradients all-reduces the total norm across the mesh: called on rank 0 only,
its all-reduce pairs with rank 1's next forward all-gathers.  The finding names `clip_grad_norm_` as the call
the user made, on rank 0, at the rank-0 `if`.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 64), nn.Linear(64, 32), nn.Linear(32, 2)])

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    mesh = init_device_mesh("cpu", (world,))
    model = Net()
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    for epoch in range(3):
        for step in range(8):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            loss.backward()
            if rank == 0 and step == 3:  # expect: DDP201
                norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # grad-norm logging, rank 0 only
                print(f"epoch {epoch}: grad norm {norm.to_local().item():.4f}", flush=True)
            opt.step()
            opt.zero_grad()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
