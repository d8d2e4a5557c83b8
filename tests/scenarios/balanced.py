"""A healthy DDP job: every rank runs the same steps at the same speed (clean twin).

Twin of straggler.py (no rank is slower) and the reference "balanced job" of the
performance doctor; also calls sampler.set_epoch(epoch) (twin of
seed_001_no_set_epoch.py).  Compute dominates the step (the in-memory loader
costs well under a millisecond per batch): ddp-doctor must report verdict ok,
and neither a straggler nor a data-bound loader.
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

    x = torch.randn(1024, 64)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
