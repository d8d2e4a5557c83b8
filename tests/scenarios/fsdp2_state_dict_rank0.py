"""Rank 0 alone takes the full state dict of an FSDP2 model to save it (DDP201).

`get_model_state_dict(..., full_state_dict=True)` all-gathers every parameter's shards: called on rank 0
only, its all-gathers pair with rank 1's next training forward.  The culprit is rank 0 at its `if` (not
rank 1, whose forward count at a shared line is only ahead because rank 0 stopped), named as the call made.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
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
            opt.step()
            opt.zero_grad()
        if rank == 0:  # expect: DDP201
            sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
            print(f"epoch {epoch}: {len(sd)} tensors to save", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
