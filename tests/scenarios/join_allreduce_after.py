"""Clean twin of join_logged_allreduce.py: uneven per-rank inputs under DDP's `Join`; the losses are summed
locally and all-reduced once after the Join block, where every rank calls it."""
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
    total = torch.zeros(2)
    with Join([model]):
        for step, (x, y) in enumerate(batches):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            total += torch.tensor([loss.item(), 1.0])
    dist.all_reduce(total)  # after the Join: every rank calls it once
    if rank == 0:
        print(f"mean loss {total[0].item() / total[1].item():.3f}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
