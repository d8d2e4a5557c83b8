"""Seed 004: the loader cannot keep up — every step waits for data (DDP401).

GPU utilisation "jumps between 0% and 100%": each sample costs a fixed decode
time (SAMPLE_DELAY_S, default 4 ms: an image decode / augmentation stand-in)
and the DataLoader has num_workers=0, so the training loop waits
batch_size * SAMPLE_DELAY_S = 32 ms for every batch while the step itself takes
a few milliseconds.  The injected delay is known, so a measured data wait can be
checked against it (scenarios.json "truth").
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


class DecodedImages(Dataset):
    def __init__(self, n=512):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x[:, 0] > 0).long()

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        time.sleep(SAMPLE_DELAY_S)  # decode + augment
        return self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = DecodedImages()
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler, num_workers=0)  # expect: DDP401

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
