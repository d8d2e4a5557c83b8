"""A healthy job: 40 DDP steps with a short pause each (about 4 s of training)."""
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range(int(os.environ.get("STEPS", "40"))):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.1)
    dist.destroy_process_group()
    print("TRAINING DONE", dist.is_initialized(), flush=True)


if __name__ == "__main__":
    main()
