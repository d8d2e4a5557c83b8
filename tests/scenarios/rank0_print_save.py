"""Rank-0-only printing, logging and checkpoint saving, with no collective under the guard (clean twin).

Twin of rank0_barrier.py / rank0_metric_allreduce.py: everything inside
`if rank == 0:` is local work, and the one synchronisation after saving is a
barrier that *every* rank reaches.
"""
import datetime
import logging
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

log = logging.getLogger("train")


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING)
    torch.manual_seed(0)
    ckpt_dir = tempfile.mkdtemp(prefix="ckpt-") if rank == 0 else None

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
            if rank == 0 and step % 4 == 3:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}", flush=True)
                log.info("lr=%s", opt.param_groups[0]["lr"])
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "epoch": epoch}, os.path.join(ckpt_dir, f"ep{epoch}.pt"))
        dist.barrier()  # every rank: nobody reads the checkpoint before it is written

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
