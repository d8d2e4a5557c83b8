"""Seed 003: only rank 0 prepares the data; the other ranks `return` early and rank 0's barrier waits forever (DDP201).

The Lightning/Fabric post: "in the dataset creation function only one rank
creates the dataset and the other ranks return directly ... the program gets
stuck in DistributedDataParallel initialisation (_verify_params_across_processes)".
Here `prepare_data()` returns early on ranks != 0, so the barrier meant to make
them wait is reached by rank 0 only, while rank 1 is already inside DDP(...).
"""
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def prepare_data(cache):
    """Download + preprocess once (rank 0), the others should wait for it."""
    if dist.get_rank() != 0:
        return  # expect: DDP201
    x = torch.randn(128, 16)
    torch.save({"x": x, "y": (x[:, 0] > 0).long()}, cache)
    dist.barrier()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    cache = os.path.join(tempfile.gettempdir(), f"seed003-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}.pt")

    prepare_data(cache)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))

    data = torch.load(cache)
    loader = DataLoader(TensorDataset(data["x"], data["y"]), batch_size=16, shuffle=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
