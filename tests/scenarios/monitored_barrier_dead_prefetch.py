"""Rank 1's prefetch thread dies before it posts the end of the epoch; its training loop waits forever on
the batch queue, and rank 0's `monitored_barrier` times out and raises (DDP205 on rank 1, not rank 0).

A background thread fills a queue with this epoch's batches, then None.  On rank 1 it fails while closing
its shard after the last batch (the exception is only printed by the thread): the main loop, done with the
epoch's steps, blocks in `queue.get()`.  Rank 0 reaches the epoch-end `monitored_barrier(timeout=8s)`,
which raises on rank 0 after 8 s: rank 0's error is the consequence, the cause is rank 1's dead thread and
the line it waits at.
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
    for i in range(n):
        x = torch.randn(16, 16)
        q.put((x, (x[:, 0] > 0).long()))
    if rank == 1 and epoch == 1:
        raise OSError("shard 7: stale file handle")  # the thread dies; nobody joins it
    q.put(None)


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
            batch = q.get()  # expect: DDP205
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
