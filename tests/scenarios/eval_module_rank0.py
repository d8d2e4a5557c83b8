"""Validation on rank 0 through `model.module` (the plain nn.Module), other ranks wait at a shared barrier (clean twin).

Twin of seed_000_val_rank0_bn.py: the unwrapped module issues no collective, so
evaluating it on one rank is safe.  The barrier after it is reached by every rank.
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
def validate(net, loader):
    net.eval()
    correct = total = 0
    for xb, yb in loader:
        out = net(xb)
        correct += (out.argmax(1) == yb).sum().item()
        total += len(yb)
    net.train()
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
        if rank == 0:
            acc = validate(model.module, val_loader)
            print(f"epoch {epoch} loss {loss.item():.4f} val acc {acc:.3f}", flush=True)
        dist.barrier()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
