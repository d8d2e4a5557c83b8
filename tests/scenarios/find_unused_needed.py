"""find_unused_parameters=True where a parameter really is unused (clean twin of DDP405).

The auxiliary head is only used when `aux=True`, which this training loop never
asks for, so its parameters never get a gradient: without
find_unused_parameters=True DDP would raise at the second iteration.  The flag is
needed and must not be reported.
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
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.ReLU())
        self.head = nn.Linear(64, 2)
        self.aux_head = nn.Linear(64, 4)  # used by the pre-training stage only

    def forward(self, x, aux=False):
        h = self.encoder(x)
        return (self.head(h), self.aux_head(h)) if aux else self.head(h)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(512, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(Net(), find_unused_parameters=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
