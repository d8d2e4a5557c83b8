"""A rank blocked forever in its own data-reading code, no DataLoader workers (DDP205 on that rank).

The dataset reads records from a local pipe fed by a decoder process
(num_workers=0, so the main process reads).  On rank 1 the decoder died after
40 records: the read blocks forever.  Rank 0 trains on and waits in the
gradient all-reduce for rank 1, which never comes.  The cause is rank 1, at
its read, not rank 0's all-reduce.
"""
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class PipeRecords(Dataset):
    """Records decoded elsewhere and read through a FIFO; rank 1's feeder stops after `alive` records."""

    def __init__(self, rank, n=256, alive=40):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.rank, self.alive, self.served = rank, alive, 0
        self.fifo = os.path.join(tempfile.mkdtemp(), "records")
        os.mkfifo(self.fifo)

    def __len__(self):
        return len(self.x)

    def read_record(self, i):
        self.served += 1
        if self.rank == 1 and self.served > self.alive:
            with open(self.fifo, "rb") as f:  # expect: DDP205
                f.read(64)  # the feeder is gone: nobody ever writes
        return self.x[i]

    def __getitem__(self, i):
        x = self.read_record(i)
        return x, int(x[0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    ds = PipeRecords(rank)
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, batch_size=8, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
