"""One rank's data is slow: rank 1 reads its shard from a slow disk (DDP404 straggler, data phase).

Same model as straggler.py, but the extra time is in rank 1's *loader*: each of
its samples costs SLOW_SAMPLE_S (default 3 ms, batch 8 = 24 ms per batch) with
num_workers=0; rank 0's samples are free.  Rank 0 then waits for rank 1 in
every gradient all-reduce.  ddp-doctor should name rank 1 as the straggler and
its data phase as the slow part (and may report DDP401 for rank 1).
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

SLOW_SAMPLE_S = float(os.environ.get("SLOW_SAMPLE_S", 0.003))


class ShardOnDisk(Dataset):
    def __init__(self, sample_cost_s, n=1024):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.y = (self.x[:, 0] > 0).long()
        self.sample_cost_s = sample_cost_s

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if self.sample_cost_s:
            time.sleep(self.sample_cost_s)  # slow disk on this rank's node
        return self.x[i], self.y[i]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    dataset = ShardOnDisk(SLOW_SAMPLE_S if rank == 1 else 0.0)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(64, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 2)))
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
