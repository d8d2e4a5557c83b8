"""all_reduce of validation statistics whose dtype depends on the rank's data (DDP203).

`torch.tensor([loss_sum, n])` is float32 when the rank evaluated something and
int64 when its validation shard is empty (both Python ints).  With a 3-sample
validation set split in blocks of 4, rank 1 gets nothing.
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

    x = torch.randn(259, 16)
    y = (x[:, 0] > 0).long()
    train_set = TensorDataset(x[:256], y[:256])
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    val_set = TensorDataset(x[256 + 4 * rank:260 + 4 * rank], y[256 + 4 * rank:260 + 4 * rank])  # smoke-test val split
    val_loader = DataLoader(val_set, batch_size=4)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()

        loss_sum, n = 0, 0
        with torch.no_grad():
            for xb, yb in val_loader:
                loss_sum += loss_fn(model.module(xb), yb).item() * len(yb)
                n += len(yb)
        stats = torch.tensor([loss_sum, n])
        dist.all_reduce(stats)  # expect: DDP203
        if rank == 0:
            print(f"epoch {epoch} val loss {stats[0].item() / max(stats[1].item(), 1):.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
