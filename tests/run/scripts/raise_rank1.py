"""rank 1 raises in the middle of training (DDP204); rank 0 waits in the all-reduce."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def check(step, rank):
    if step == 5 and rank == 1:
        raise ValueError("bad sample on rank 1")  # expect: DDP204


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100):
        check(step, rank)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
