"""Attempt 0: rank 1 raises; torch's agent restarts the job (``--max-restarts 1``).  Attempt 1 takes a
different path (resume from a checkpoint) where only rank 0 enters a barrier: the hang of the second
attempt must still be caught, with the first attempt's crash kept in the report."""
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    if attempt > 0 and rank == 0:  # expect: DDP201
        dist.barrier()
    for step in range(200):
        if step == 5 and rank == 1 and attempt == 0:
            raise RuntimeError("transient failure")  # expect: DDP204 (attempt 0)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
