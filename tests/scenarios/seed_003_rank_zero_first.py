"""Seed 003 done right: rank 0 prepares, then *every* rank meets at the barrier (clean twin).

Twin of seed_003_early_return_barrier.py and helper_is_main_process.py: the
barrier is outside the rank condition, so the other ranks wait for the cache
file and then load it.
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
    """Download + preprocess once (rank 0); everyone waits for it."""
    if dist.get_rank() == 0:
        x = torch.randn(128, 16)
        torch.save({"x": x, "y": (x[:, 0] > 0).long()}, cache)
    dist.barrier()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    cache = os.path.join(tempfile.gettempdir(), f"seed003-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}-ok.pt")

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
    dist.barrier()
    if rank == 0:
        os.remove(cache)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
