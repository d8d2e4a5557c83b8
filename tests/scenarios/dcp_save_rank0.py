"""`dcp.save` under `if rank == 0:` (DDP201): a distributed checkpoint written by rank 0 alone.

`torch.distributed.checkpoint.save` looks like `torch.save`, but it is a collective: it gathers every
rank's save plan on the coordinator and scatters the final plan back.  Rank 0 enters it alone, inside a
`gather_object` the user never wrote, while rank 1 goes on to the barrier after the checkpoint.  Plain
torchrun: a hang until the process-group timeout.
"""
import datetime
import os
import shutil
import tempfile

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)
    ckpt = os.path.join(tempfile.gettempdir(), f"dcp-rank0-{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(10):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
        opt.step()
    if rank == 0:  # expect: DDP201
        dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
