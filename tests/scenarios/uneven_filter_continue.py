"""A data-dependent `continue` on rank-local filtered batches (DDP101).

Each batch is filtered by a per-sample quality score; when the filter rejects
the whole batch, the loop `continue`s before forward/backward.  Rank 1's shard
(DistributedSampler, no shuffle) has one batch of rejected samples per epoch,
so rank 1 runs 7 steps per epoch and rank 0 runs 8: from then on rank 0's
gradient all-reduce of step k is averaged with rank 1's step k+1.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n=128):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, 0] > 0).long()
    quality = 0.2 + 0.8 * torch.rand(n, generator=g)
    quality[49:64:2] = 0.0  # a run of corrupt records: exactly rank 1's 4th batch
    return TensorDataset(x, y, quality)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = make_dataset()
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)
        steps = 0
        for xb, yb, q in loader:
            keep = q > 0.1
            if not keep.any():
                continue  # expect: DDP101
            opt.zero_grad()
            loss = loss_fn(model(xb[keep]), yb[keep])
            loss.backward()
            opt.step()
            steps += 1
        print(f"rank {rank} epoch {epoch}: {steps} steps, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
