"""Twin of rank0_block_above_loop: the barrier follows the rank-0 block, so every rank reaches it."""
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def make_dataset(rank):
    path = os.path.join(tempfile.gettempdir(), f"ddp_doctor_cache_{os.getpid()}.pt")
    if rank == 0:
        torch.save(torch.randn(64, 8), path)
    dist.barrier()
    return torch.randn(64, 8)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    data = make_dataset(rank)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i in range(0, len(data), 8):
        loss = model(data[i:i + 8]).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
