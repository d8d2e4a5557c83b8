"""`dcp.save` called by every rank (clean twin of dcp_save_rank0): the way a distributed checkpoint is written.

Every rank enters `dcp.save` with its state dict; DCP decides who writes what.  Rank 0 alone removes the
directory at the end, after a barrier.
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
    ckpt = os.path.join(tempfile.gettempdir(), f"dcp-all-{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}")
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        for step in range(5):
            loss = model(torch.randn(8, 16)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            for p in model.parameters():
                dist.all_reduce(p.grad)
            opt.step()
        dcp.save({"model": model.state_dict()}, checkpoint_id=ckpt)
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(ckpt, ignore_errors=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
