"""Twin of fsdp2_mesh_tp_rank_local: FSDP2 over "dp" on a 2-D DeviceMesh (4 ranks), and every rank of a
"tp" pair exchanges the auxiliary statistic each step (the decision to use it is taken on the averaged
value, the same on both ranks of the pair).  Clean."""
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
        aux = aux.reshape(1)
        dist.all_reduce(aux, group=mesh.get_group("tp"))
        if aux.item() / 2 > 0.8:
            loss = loss.detach()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
