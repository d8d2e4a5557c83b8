"""Every rank's DataLoader workers deadlock on a lock that was held when they were forked (DDP205).

A background thread refreshes a feature cache and holds the cache lock while
it does (30 s).  The DataLoader forks its workers during that time; each
worker inherits the lock *locked*, with no thread left to release it, so the
first `__getitem__` blocks forever in `with self.lock:`.  No rank is in a
collective: plain torchrun waits forever.
"""
import datetime
import os
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class CachedFeatures(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.scale = torch.ones(16)
        self.lock = threading.Lock()

    def refresh(self, seconds):
        with self.lock:  # recompute normalisation statistics
            time.sleep(seconds)
            self.scale = 1.0 / (self.x.std(0) + 1e-6)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        with self.lock:  # expect: DDP205
            x = self.x[i] * self.scale
        return x, int(x[0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    ds = CachedFeatures()
    threading.Thread(target=ds.refresh, args=(30,), daemon=True).start()
    time.sleep(0.5)  # the refresh is under way
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:  # expect: DDP205
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
