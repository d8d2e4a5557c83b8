"""Shared set-up of the hung jobs: a small DDP model on gloo with a long process-group timeout (they must stay hung)."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def setup():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    return dist.get_rank(), model, torch.optim.SGD(model.parameters(), lr=0.1)


def train_step(model, opt, x, y):
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


def mark(text):
    """Tell the test this rank reached the part that hangs."""
    print(f"rank {os.environ['RANK']} {text}", flush=True)
