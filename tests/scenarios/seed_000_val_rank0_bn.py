"""Seed 000: validation through the DDP model on rank 0 only, with BatchNorm (DDP202).

The blog post: "epoch 1 trains and validates fine, then training hangs at the
start of epoch 2; broadcast_buffers=False makes it go away".  The real cause:
`validate(model, ...)` runs the *DDP-wrapped* model on rank 0 only.  A DDP
forward broadcasts the BatchNorm buffers from rank 0 (broadcast_buffers=True is
the default), so rank 0 issues collectives rank 1 never issues and the two
ranks' collective sequences are shifted from then on.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU())
        self.head = nn.Linear(32, 2)

    def forward(self, x):
        return self.head(self.body(x))


@torch.no_grad()
def validate(model, loader):
    model.eval()
    correct = total = 0
    for xb, yb in loader:
        out = model(xb)
        correct += (out.argmax(1) == yb).sum().item()
        total += len(yb)
    model.train()
    return correct / total


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(320, 16)
    y = (x[:, 0] > 0).long()
    train_set = TensorDataset(x[:256], y[:256])
    val_set = TensorDataset(x[256:], y[256:])
    sampler = DistributedSampler(train_set, shuffle=True, seed=0, drop_last=True)
    train_loader = DataLoader(train_set, batch_size=16, sampler=sampler, drop_last=True)
    val_loader = DataLoader(val_set, batch_size=16)

    model = DDP(Net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in train_loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if rank == 0:  # expect: DDP202
            acc = validate(model, val_loader)
            print(f"epoch {epoch} loss {loss.item():.4f} val acc {acc:.3f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
