"""Uneven per-rank inputs under DDP's `Join`, with the step's loss all-reduced for logging inside the Join.

Rank 1 has 25 batches, rank 0 20.  After 20 steps rank 0 joins: it shadows DDP's join notification and
gradient all-reduce for rank 1, and nothing else, so rank 1's logging all_reduce is paired with a shadow
call of another size and gloo aborts.  The line to change is the all_reduce inside the Join block (clean
twin: join_allreduce_after.py).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    batches = [(torch.randn(8, 16), torch.randint(0, 2, (8,))) for _ in range(20 + 5 * rank)]
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with Join([model]):
        for step, (x, y) in enumerate(batches):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            avg = loss.detach().clone()
            dist.all_reduce(avg)  # expect: DDP201
            if rank == 0 and step % 5 == 0:
                print(f"step {step} loss {avg.item() / world:.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
