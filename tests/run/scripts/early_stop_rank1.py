"""Rank 1 stops early on a local condition and finishes; rank 0 waits (DDP204 finished + DDP101)."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if rank == 1 and step == 6:
            break  # expect: DDP101
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
