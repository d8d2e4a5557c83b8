"""Rank 0 also trains a small linear probe of its own, with its own optimizer, at every step (clean).

The probe's optimizer steps parameters no other rank has: it is not a training step of the DDP model, and
rank 0's gradient all-reduces still pair one for one with rank 1's.  Every epoch ends with a metric
all_reduce on every rank.
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
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = DistributedSampler(dataset, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    body = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
    model = DDP(nn.Sequential(body, nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = nn.Linear(32, 2) if rank == 0 else None
    probe_opt = torch.optim.Adam(probe.parameters(), lr=1e-3) if probe is not None else None
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
            if probe is not None:  # how linearly separable are the features so far?
                probe_opt.zero_grad()
                nn.functional.cross_entropy(probe(body(xb).detach()), yb).backward()
                probe_opt.step()
        loss = torch.tensor([float(epoch)])
        dist.all_reduce(loss)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
