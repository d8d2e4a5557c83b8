"""The twin of monitored_barrier_dead_prefetch: the prefetch thread always posts the end of the epoch (clean).

Rank 1's thread still fails while closing its shard after the last batch, but it logs the error and posts
None in a `finally`, so every rank leaves the epoch's loop and passes the `monitored_barrier`.
"""
import datetime
import os
import queue
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def prefetch(rank, epoch, q, n):
    try:
        for i in range(n):
            x = torch.randn(16, 16)
            q.put((x, (x[:, 0] > 0).long()))
        if rank == 1 and epoch == 1:
            raise OSError("shard 7: stale file handle")
    except OSError as e:
        print(f"rank {rank}: prefetch: {e}", flush=True)
    finally:
        q.put(None)  # the loop always learns the epoch is over


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        q = queue.Queue(maxsize=4)
        threading.Thread(target=prefetch, args=(rank, epoch, q, 8), daemon=True).start()
        while True:
            batch = q.get()
            if batch is None:
                break
            xb, yb = batch
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=8))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
