"""`all_gather_object` only on the rank that saw a bad batch (DDP201 on rank 1, at the gather).

Before each backward, a rank looks for non-finite samples in its batch and, if it finds
any, all-gathers the sample ids "so rank 0 can log every rank's bad samples" — but only
the rank that found some makes the call.  Rank 1's shard has a corrupt record in its very
first batch: its object gather (a size all_gather, then the pickled bytes) faces rank 0's
DDP gradient all-reduce of the first step.
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
            if bad:  # expect: DDP201
                reports = [None] * world
                dist.all_gather_object(reports, (rank, bad))
                if rank == 0:
                    print(f"bad samples: {reports}", flush=True)
            keep = torch.isfinite(xb).all(dim=1)
            (losses * keep).sum().div(keep.sum().clamp(min=1)).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
