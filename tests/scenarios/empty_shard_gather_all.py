"""The twin of empty_shard_gather: the helper gathers on every rank, an empty shard's summary included, and
reads the empty ones afterwards.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def summarise(preds):
    mine = {"n": len(preds), "mean": sum(preds) / len(preds) if preds else None}
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    return {"ranks": every}


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(128, 16)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()

    evalset = TensorDataset(torch.tensor([[5.0] + [0.0] * 15, [-5.0] + [0.0] * 15, [0.01] + [0.0] * 15]))
    eval_loader = DataLoader(evalset, batch_size=4, sampler=DistributedSampler(evalset, shuffle=False, drop_last=True))
    preds = []
    with torch.no_grad():
        for (xb,) in eval_loader:
            p = model.module(xb).softmax(-1)[:, 1]
            preds += [v for v, row in zip(p.tolist(), xb) if row[0] > 1]  # the positive region only
    summary = summarise(preds)
    print(f"rank {rank} summary {summary}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
