"""Twin of barrier_before_training: rank 0 does its own work under `if rank == 0`, then every rank
meets at the barrier before the first step.  Reported clean."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if rank == 0:
        print("rank 0 prepares the run", flush=True)
    dist.barrier()  # every rank: the others wait here for rank 0
    for step in range(200):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
