"""A loader that keeps up: cheap samples, 2 persistent workers prefetching (clean twin).

Twin of seed_004_data_bound.py and workers_restart.py: num_workers=2,
persistent_workers=True, a cheap worker_init_fn, and a step whose compute
dominates.  ddp-doctor must report neither data-bound nor worker restarts.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Samples(Dataset):
    def __init__(self, n=1024):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


def seed_worker(worker_id):
    torch.manual_seed(torch.initial_seed() % 2**31 + worker_id)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = Samples()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=32, sampler=sampler, num_workers=2,
                        persistent_workers=True, prefetch_factor=4, worker_init_fn=seed_worker)

    model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
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
