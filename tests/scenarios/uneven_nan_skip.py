"""A rank-local NaN-loss skip (DDP101).

"Skip the batch if the loss is not finite" — but only the rank that saw the
NaN skips its backward pass.  One bad record in rank 1's shard makes rank 1
skip one step per epoch; rank 0 does not, and the ranks' gradient all-reduces
are paired one step apart for the rest of the run.
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

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    x[81] = float("nan")  # one corrupt record; with shuffle=False it lands in rank 1's 3rd batch
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            if not torch.isfinite(loss):
                print(f"rank {rank} epoch {epoch} step {step}: non-finite loss, skipping batch", flush=True)
                continue  # expect: DDP101
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
