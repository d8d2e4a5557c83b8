"""Gradient accumulation with DDP.no_sync(), and a NaN-loss guard that `continue`s before backward on
whichever rank draws the poisoned sample -- here rank 1, on the last micro-step of one accumulation.

That micro-step's forward prepared the gradient sync; with no backward after it, DDP runs the sync at the
rank's next backward (the next accumulation's first micro-step, under no_sync()).  Every rank makes the same
number of gradient all-reduces, so the job ends without a hang -- but from then on rank 1's all-reduces pair
with rank 0's of other steps: the replicas average gradients out of step, silently.  ddp-doctor must end it
well (exit 0) and warn at the `continue` (DDP101, rank 1).  Twin: grad_accum_no_sync.
"""
import contextlib
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ACCUM = 4


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(512, 16)
    y = (x[:, 0] > 0).long()
    # one poisoned sample: with shuffle=False, rank 1 draws index 2*i+1; it is in rank 1's batch 7 (the last
    # micro-step of its second accumulation)
    x[2 * (7 * 8 + 3) + 1, 0] = float("nan")
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        opt.zero_grad()
        for i, (xb, yb) in enumerate(loader):
            last_micro_step = (i + 1) % ACCUM == 0
            with contextlib.nullcontext() if last_micro_step else model.no_sync():
                loss = loss_fn(model(xb), yb) / ACCUM
                if not torch.isfinite(loss):
                    continue  # expect: DDP101
                loss.backward()
            if last_micro_step:
                opt.step()
                opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * ACCUM:.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
