"""An HF-style `training_step()` returns None for a batch without labelled tokens and the loop `continue`s.

The unlabelled samples fall in rank 0's shard only, so rank 0 skips one backward per epoch and leaves the
epoch one gradient all-reduce early: its epoch-end all_reduce pairs with rank 1's last gradient all-reduce.
Both ranks draw the same number of batches -- the loop is not shorter on rank 0; the line to change is the
`continue`, and a skipped step is DDP101 (the all_reduce only rank 0 reached then is where it showed).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

IGNORE = -100


def training_step(model, batch):
    x, labels = batch
    if (labels != IGNORE).sum() == 0:
        return None
    return nn.functional.cross_entropy(model(x), labels, ignore_index=IGNORE)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    y = torch.randint(0, 2, (256,))
    y[96:112:2] = IGNORE  # with shuffle=False these are all of rank 0's 7th batch
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(3):
        sampler.set_epoch(epoch)
        for batch in loader:
            loss = training_step(model, batch)
            if loss is None:
                continue  # expect: DDP101
            opt.zero_grad()
            loss.backward()
            opt.step()
        seen = torch.tensor([float(epoch)])
        dist.all_reduce(seen)
        if rank == 0:
            print(f"epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
