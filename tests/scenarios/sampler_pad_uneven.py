"""DistributedSampler(drop_last=False) over a dataset that does not divide evenly (clean twin).

Twin of seed_002_uneven_shards.py.  191 samples on 2 ranks, batch size 10: the
sampler *pads* (repeats one index) so each rank gets 96 indices = 10
batches, the last one of 6 samples on both ranks.  Folklore blames
drop_last=False for hangs; it is not a cause by itself and must be reported clean.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(191, 16)  # odd on purpose: 191 = 2 * 95 + 1
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0, drop_last=False)
    loader = DataLoader(dataset, batch_size=10, sampler=sampler, drop_last=False)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch}: {len(loader)} batches, last batch {len(xb)}, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
