"""A healthy 4-rank job on subgroups: a 2x2 DeviceMesh, DDP on the data-parallel group, per-node work on the
other groups; must be reported clean.

`init_device_mesh("cpu", (2, 2))` gives data-parallel groups [0, 2] / [1, 3] and
"node" groups [0, 1] / [2, 3]; `new_subgroups(group_size=2)` builds the node groups
again.  DDP runs on the rank's dp group, so its gradient all-reduces are numbered per
dp group.  Each step every rank calls the statistics all_reduce of *every* node group:
torch makes the call a no-op on the ranks outside the group, and the two groups reduce
tensors of different lengths.  Sequence numbers are per group, so none of this may be
paired across groups.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "node"))
    node_group, node_groups = dist.new_subgroups(group_size=2)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)), process_group=mesh.get_group("dp"))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(12):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        for n, g in enumerate(node_groups):  # the ranks outside g skip the call (torch: a no-op there)
            stats = torch.full((3 + n,), loss.item())
            dist.all_reduce(stats, group=g)
        node_loss = loss.detach().reshape(1)
        dist.all_reduce(node_loss, group=mesh.get_group("node"))
        if rank % 2 == 0 and step % 4 == 3:
            print(f"rank {rank} step {step} node loss {node_loss.item() / 2:.4f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
