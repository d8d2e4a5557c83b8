"""`ZeroRedundancyOptimizer.consolidate_state_dict()` on rank 0 only (DDP201).

To save the optimizer, rank 0 consolidates the sharded optimizer state -- but consolidation is a
collective: each rank broadcasts the shard it owns.  Rank 0 enters it alone (a `broadcast` the user never
wrote) while rank 1 goes on to the next epoch's training.  Plain torchrun: a hang until the process-group
timeout.
"""
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
        if rank == 0:  # expect: DDP201
            opt.consolidate_state_dict(to=0)
            state = opt.state_dict()
            print(f"epoch {epoch}: optimizer state of {len(state['state'])} parameters", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
