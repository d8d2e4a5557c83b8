"""rank 0 calls barrier() inside `if rank == 0` (DDP201) after a few training steps."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(200):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 10 and rank == 0:  # expect: DDP201
            dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
