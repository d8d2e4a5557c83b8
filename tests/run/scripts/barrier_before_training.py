"""`if rank == 0: dist.barrier()` after DDP's constructor, before the first step: rank 1 goes on into its
first forward/backward.  Neither rank has run the other's line, so the odd one out is the rank that never
trained (DDP201 at the barrier), not "rank 1 runs the DDP model alone" (DDP202)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:  # expect: DDP201
        dist.barrier()
    for step in range(200):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
