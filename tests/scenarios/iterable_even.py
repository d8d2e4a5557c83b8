"""An IterableDataset sharded so every rank yields the same number of records (clean twin).

Twin of uneven_iterable.py: one global stream of 136 records; rank r takes
records r, r+W, r+2W, ... and every rank stops after 136 // W records, so all
ranks run the same number of steps (the odd leftovers are dropped).
"""
import datetime
import itertools
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset

TOTAL_RECORDS = 136


class RecordStream(IterableDataset):
    def __init__(self, rank, world_size):
        self.rank, self.world_size = rank, world_size

    def records(self):
        g = torch.Generator().manual_seed(0)
        for _ in range(TOTAL_RECORDS):
            x = torch.randn(16, generator=g)
            yield x, int(x[0] > 0)

    def __iter__(self):
        per_rank = TOTAL_RECORDS // self.world_size
        return itertools.islice(self.records(), self.rank, per_rank * self.world_size, self.world_size)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    loader = DataLoader(RecordStream(rank, dist.get_world_size()), batch_size=8)

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
