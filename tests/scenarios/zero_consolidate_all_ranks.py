"""`ZeroRedundancyOptimizer.consolidate_state_dict(to=0)` on every rank, the state saved by rank 0 (clean twin
of zero_consolidate_rank0)."""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=1e-3)
    for epoch in range(3):
        for step in range(5):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            state = opt.state_dict()
            print(f"epoch {epoch}: optimizer state of {len(state['state'])} parameters", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
