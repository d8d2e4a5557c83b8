"""Rank 0 alone evaluates an FSDP2 (`fully_shard`) model after each epoch (DDP201).

A sharded model holds only its shard of each parameter: its forward all-gathers the full parameters from
every rank of the mesh.  Evaluating on rank 0 alone makes rank 0's all-gathers pair with rank 1's next
training step -- the same all-gathers at first (gloo pairs them silently), then rank 1's backward
reduce-scatters with rank 0's forward.  Plain torchrun: a hang or a gloo abort, far from the cause.
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


def evaluate(model):
    with torch.no_grad():
        val = torch.randn(32, 16)
        return model(val).pow(2).mean().item()


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
            opt.step()
            opt.zero_grad()
        if rank == 0:  # expect: DDP201
            print(f"epoch {epoch}: val loss {evaluate(model):.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
