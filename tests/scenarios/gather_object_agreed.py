"""Twin of bad_batch_gather_object: the ranks agree first whether any of them saw a bad batch.

An all_reduce(MAX) of the number of bad samples runs on every rank every step; when it is
non-zero every rank calls `all_gather_object` (with an empty list where it has none), so
the gather is matched on every rank.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    x[1, 3] = float("nan")  # a corrupt record; DistributedSampler(shuffle=False) gives index 1 to rank 1
    y = (x[:, 0] > 0).long()
    ids = torch.arange(256)
    dataset = TensorDataset(x, y, ids)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss(reduction="none")

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb, ib in loader:
            opt.zero_grad()
            losses = loss_fn(model(torch.nan_to_num(xb)), yb)
            bad = ib[~torch.isfinite(xb).all(dim=1)].tolist()
            any_bad = torch.tensor([len(bad)])
            dist.all_reduce(any_bad, op=dist.ReduceOp.MAX)  # every rank learns whether some rank has one
            if any_bad.item() > 0:
                reports = [None] * world
                dist.all_gather_object(reports, (rank, bad))
                if rank == 0:
                    print(f"bad samples: {reports}", flush=True)
            keep = torch.isfinite(xb).all(dim=1)
            (losses * keep).sum().div(keep.sum().clamp(min=1)).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
