"""Ranks call different collectives at the same point: broadcast on one, barrier on the other (DDP203).

Resuming from a node-local checkpoint directory: rank 0's node has last.pt from
a previous run and broadcasts the epoch to resume from; rank 1's node has no
file and "just waits" in a barrier.  The two ranks meet in different ops.
"""
import datetime
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def resume_epoch(ckpt):
    if ckpt.exists():  # expect: DDP203
        epoch = torch.tensor([torch.load(ckpt)["epoch"] + 1])
        dist.broadcast(epoch, src=0)
        return int(epoch.item())
    dist.barrier()
    return 0


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    run_id = os.environ.get("TORCHELASTIC_RUN_ID", "local")
    node_dir = Path(tempfile.gettempdir()) / f"op-mismatch-{run_id}-{os.getpid()}"  # node-local scratch
    node_dir.mkdir(parents=True, exist_ok=True)
    if rank == 0:  # a previous run left a checkpoint on this node only
        torch.save({"epoch": 1}, node_dir / "last.pt")

    start = resume_epoch(node_dir / "last.pt")

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(start, 3):
        for step in range(8):
            x = torch.randn(16, 16)
            loss = model(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
