"""Rank 1 is SIGKILLed mid-training (as by the OOM killer): DDP204 names SIGKILL."""
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(200):
        if step == 8 and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)  # expect: DDP204
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
