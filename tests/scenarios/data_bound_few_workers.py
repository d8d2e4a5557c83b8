"""Still data-bound with workers: one worker cannot keep up with an expensive per-sample transform (DDP401).

num_workers=1 and each sample costs SAMPLE_DELAY_S (default 4 ms; batch 8 =
32 ms per batch for the single worker) while the training step takes a few
milliseconds: the loop waits ~30 ms per step even though loading happens in a
worker.  A check that only looks for num_workers=0 misses this one.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SAMPLE_DELAY_S = float(os.environ.get("SAMPLE_DELAY_S", 0.004))


class Augmented(Dataset):
    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(SAMPLE_DELAY_S)  # heavy augmentation pipeline
        return self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = Augmented()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=1, persistent_workers=True)  # expect: DDP401

    model = DDP(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
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
