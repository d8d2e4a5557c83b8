"""An IterableDataset whose streams have different lengths on different ranks (DDP101).

Each rank streams the records of "its" files.  The files hold 76 and 60 records,
so with batch_size 8 rank 0 runs 10 steps per epoch and rank 1 runs 8.  An
IterableDataset has no len() and DistributedSampler cannot help, so nothing
warns before training.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

RECORDS_PER_RANK = [76, 60]


class RecordStream(IterableDataset):
    def __init__(self, rank):
        self.rank = rank

    def __iter__(self):
        g = torch.Generator().manual_seed(self.rank)
        for _ in range(RECORDS_PER_RANK[self.rank]):
            x = torch.randn(16, generator=g)
            yield x, int(x[0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    loader = DataLoader(RecordStream(rank), batch_size=8)  # expect: DDP101

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        steps = 0
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            steps += 1
        print(f"rank {rank} epoch {epoch}: {steps} steps, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
