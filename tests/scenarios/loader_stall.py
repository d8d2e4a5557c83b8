"""Every rank stalls in its DataLoader: the workers wait for a shard that never arrives (DDP205).

The dataset reads shard files that a sync job is supposed to copy to local
disk; `__getitem__` polls until the file exists.  The sync job is dead, so
from the 3rd batch on every worker of every rank polls forever.  No rank is in
a collective, so the process-group timeout never fires: plain torchrun waits
forever.  (DataLoader(timeout=0) is the default.)
"""
import datetime
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SYNC_DIR = Path(tempfile.gettempdir()) / "shard-sync-never-arrives"


class ShardedRecords(Dataset):
    records_per_shard = 32

    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        shard = i // self.records_per_shard
        if shard > 0:  # shard 0 ships with the job; the others come from the sync job
            path = SYNC_DIR / f"shard-{shard:05d}.done"
            while not path.exists():
                time.sleep(0.2)  # expect: DDP205
        return self.x[i], int(self.x[i, 0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    ds = ShardedRecords()
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (x, y) in enumerate(loader):  # expect: DDP205
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
