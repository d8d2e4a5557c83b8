"""Barrier inside `if rank == 0:` (DDP201): rank 0 waits for ranks that never come.

Rank 0 prepares a vocabulary file and then calls `dist.barrier()` *inside* the
rank-0 branch, "to make the others wait for the file".  The other ranks never
reach that barrier; they go on to build the DDP model, whose constructor
broadcasts the parameters.  Plain torchrun: silent until the process-group
timeout.
"""
import datetime
import json
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    vocab_path = os.path.join(tempfile.gettempdir(), f"vocab-{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}.json")

    if rank == 0:  # expect: DDP201
        with open(vocab_path, "w") as f:
            json.dump({str(i): i for i in range(100)}, f)
        dist.barrier()

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(20):
        x = torch.randn(16, 16)
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if rank == 0:
        print("done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
