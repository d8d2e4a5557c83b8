"""seed 000: rank 0 validates through the DDP model (BatchNorm buffers) -> hangs next epoch (DDP202)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def validate(model):
    model.eval()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(8, 8))  # expect: DDP202
    model.train()


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for step in range(10):
            loss = model(torch.randn(8, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        if rank == 0:
            validate(model)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
