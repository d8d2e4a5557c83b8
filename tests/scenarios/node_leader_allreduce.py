"""A node-group all_reduce only the node leaders call (DDP201 on ranks 0 and 2, each in its own group).

4 ranks as 2 "nodes" of 2: every rank creates both node groups (`new_group([0, 1])`,
`new_group([2, 3])`) and trains one DDP model on the world group.  Every few steps the
node's loss is averaged over the node group for a per-node log line — but the
all_reduce sits under `if local_rank == 0:`, so each leader waits in its node group for
a peer that has gone on into the world group's gradient all-reduce.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

PER_NODE = 2


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = rank % PER_NODE
    node_groups = [dist.new_group(list(range(n, n + PER_NODE))) for n in range(0, world, PER_NODE)]
    node_group = node_groups[rank // PER_NODE]
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if local_rank == 0 and step % 4 == 3:  # expect: DDP201
                node_loss = loss.detach().reshape(1)
                dist.all_reduce(node_loss, group=node_group)
                print(f"node {rank // PER_NODE} epoch {epoch} step {step} loss {node_loss.item() / PER_NODE:.4f}",
                      flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
