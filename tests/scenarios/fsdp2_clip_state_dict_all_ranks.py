"""Twin of fsdp2_clip_rank0 and fsdp2_state_dict_rank0: every rank clips and takes the full state dict (with
cpu_offload only rank 0 keeps it); rank 0 alone prints."""
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
            norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # every rank clips
            if rank == 0 and step == 3:
                print(f"epoch {epoch}: grad norm {norm.to_local().item():.4f}", flush=True)
            opt.step()
            opt.zero_grad()
        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if rank == 0:
            print(f"epoch {epoch}: {len(sd)} tensors to save", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
