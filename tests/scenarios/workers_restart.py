"""DataLoader workers re-created every epoch, each paying a slow start-up (DDP403).

num_workers=2 without persistent_workers: every `for batch in loader` forks
new workers, and each worker's worker_init_fn takes WORKER_INIT_S (default
0.4 s: opening an LMDB / loading a tokenizer stand-in) before the first batch
of every epoch arrives.  Short epochs make the restarts a large share of the run.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

WORKER_INIT_S = float(os.environ.get("WORKER_INIT_S", 0.4))


class Records(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def open_database(worker_id):
    time.sleep(WORKER_INIT_S)  # connect / load lookup tables in each worker


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = Records()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler, num_workers=2, worker_init_fn=open_database)  # expect: DDP403

    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(4):
        sampler.set_epoch(epoch)
        t0 = time.perf_counter()
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch}: {len(loader)} steps in {time.perf_counter() - t0:.2f}s, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
