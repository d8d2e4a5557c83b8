"""One rank starts 15 s late (staging its data to local disk before init) — legitimate (clean twin: no false hang).

Rank 1 copies its shard before calling init_process_group; rank 0 meanwhile
waits inside init_process_group.  Nothing is wrong: module imports, data
staging and rendezvous before training starts must not be called a hang.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

STAGING_S = float(os.environ.get("STAGING_S", 15))


def stage_shard(local_rank):
    if local_rank == 1:  # this rank's shard is on slow network storage
        time.sleep(STAGING_S)


def main():
    stage_shard(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
