"""Gathering per-rank predictions of different lengths the right way: pad, all_gather, trim (clean twin).

Twin of allgather_shape_mismatch.py: the ranks first all-reduce the maximum
length, pad to it, gather, and cut each rank's part back to its true length.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def all_gather_varlen(t):
    n = torch.tensor([len(t)])
    sizes = [torch.zeros_like(n) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, n)
    longest = int(max(s.item() for s in sizes))
    padded = torch.cat([t, t.new_zeros(longest - len(t), *t.shape[1:])])
    out = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(out, padded)
    return [o[: int(s.item())] for o, s in zip(out, sizes)]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    x = torch.randn(355, 16)
    y = (x[:, 0] > 0).long()
    train_set = TensorDataset(x[:256], y[:256])
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    xv = x[256 + rank::world]

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()

        with torch.no_grad():
            preds = model.module(xv).argmax(1)
        gathered = all_gather_varlen(preds)
        if rank == 0:
            print(f"epoch {epoch} val acc {(torch.cat(gathered) == torch.cat([y[256::2], y[257::2]])).float().mean():.3f}")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
