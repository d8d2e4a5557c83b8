"""Rank 1 raises in the first attempt only; ``--max-restarts 1`` lets torch's agent restart the job,
which then finishes: the run is OK, and the report keeps the first attempt's crash."""
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
    for step in range(12):
        if step == 5 and rank == 1 and attempt == 0:
            raise RuntimeError("transient failure (e.g. a flaky filesystem read)")  # expect: DDP204 (attempt 0)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
