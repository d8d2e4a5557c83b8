"""NaN-loss skip agreed by all_reduce: all ranks skip the step together (clean twin).

Twin of uneven_nan_skip.py: same corrupt record on rank 1, but the decision to
skip is all-reduced (MAX of a "bad" flag) so every rank skips the same step.
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
    x[81] = float("nan")
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
            bad = torch.tensor([0.0 if torch.isfinite(loss) else 1.0])
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)  # skip on all ranks or none
            if bad.item() > 0:
                if rank == 0:
                    print(f"epoch {epoch} step {step}: non-finite loss on some rank, all ranks skip", flush=True)
                continue
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
