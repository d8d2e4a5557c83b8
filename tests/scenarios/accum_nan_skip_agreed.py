"""Twin of accum_nan_skip_last_micro: the same accumulation and poisoned sample on rank 1, but the ranks agree
on the skip (an all-reduce of the flag, MAX) before acting: every rank skips that micro-step's backward, so
every rank's pending sync runs at the same later backward and the all-reduces stay paired step for step.
ddp-doctor must report it clean (exit 0, no DDP101).
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
                bad = torch.tensor(0.0 if torch.isfinite(loss) else 1.0)
                dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # skip together
                if bad.item() > 0:
                    continue
                loss.backward()
            if last_micro_step:
                opt.step()
                opt.zero_grad()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item() * ACCUM:.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
