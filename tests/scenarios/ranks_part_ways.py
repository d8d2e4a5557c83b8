"""After their last collective the ranks part ways (clean): rank 0 exits at once, rank 1 exports for 15 s.

Every rank trains, agrees on the final metric (all_reduce) and leaves the
process group.  Rank 0 then exits 0; rank 1 writes an export of the model
(CPU work and file writes) for ~15 s before it exits 0.  No rank ever needs
another, so nothing is wrong.
"""
import datetime
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EXPORT_S = float(os.environ.get("EXPORT_S", 15))


def export(model, rank):
    """Stands in for a slow export (tracing, quantizing, uploading): CPU work and writes for EXPORT_S."""
    end = time.monotonic() + EXPORT_S
    with tempfile.TemporaryDirectory() as d:
        i = 0
        while time.monotonic() < end:
            w = torch.randn(256, 256) @ torch.randn(256, 256)
            torch.save({"chunk": w}, os.path.join(d, f"export-{rank}-{i % 4}.pt"))
            i += 1
    print(f"rank {rank}: exported in {i} chunks", flush=True)


def main():
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

    loss_sum = torch.zeros(1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            loss_sum += loss.detach()
    dist.all_reduce(loss_sum)
    dist.destroy_process_group()
    if rank == 1:
        export(model.module, rank)


if __name__ == "__main__":
    main()
