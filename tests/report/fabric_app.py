"""A small Lightning Fabric job (2 CPU ranks) for `ddp-doctor run`."""
import os

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


def main():
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    loader = fabric.setup_dataloaders(DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32))
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = fabric.setup(model, opt)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            fabric.backward(F.cross_entropy(model(xb), yb))
            opt.step()
        if os.environ.get("LIT_BUG") and fabric.global_rank == 0:
            fabric.barrier()  # the bug: rank 0 only
    fabric.print("done")


if __name__ == "__main__":
    main()
