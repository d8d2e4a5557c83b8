"""Every rank evaluates the FSDP2 (`fully_shard`) model on its share of the validation data, then the losses
are averaged with an all_reduce and rank 0 prints (clean twin of fsdp2_eval_rank0)."""
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
        loss = model(val).pow(2).mean().reshape(1)
    dist.all_reduce(loss)
    return loss.item() / dist.get_world_size()


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
        val_loss = evaluate(model)
        if rank == 0:
            print(f"epoch {epoch}: val loss {val_loss:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
