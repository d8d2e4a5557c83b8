"""Uneven shard streams under DDP's Join, read by DataLoader workers (clean).

An IterableDataset streams this rank's shards: 448 samples on rank 0, 352 on rank 1 (56 vs 44 batches of 8),
read by 2 workers.  Each epoch runs inside `with model.join():`, the documented fix for uneven inputs, so the
ranks legitimately run different numbers of steps; one `dist.barrier()` after the epochs.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

SAMPLES = [448, 352]


class ShardStream(IterableDataset):
    def __init__(self, rank):
        self.rank = rank

    def __iter__(self):
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        g = torch.Generator().manual_seed(self.rank)
        for i in range(SAMPLES[self.rank]):
            x = torch.randn(16, generator=g)
            if i % workers == worker:
                yield x, int(x[0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    loader = DataLoader(ShardStream(rank), batch_size=8, num_workers=2)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        with model.join():
            for xb, yb in loader:
                opt.zero_grad()
                nn.functional.cross_entropy(model(xb), yb).backward()
                opt.step()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
