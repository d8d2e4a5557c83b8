"""A rank is SIGKILLed mid-training, as the kernel OOM killer does (DDP204).

Rank 1 "runs out of host memory" at step 6 of epoch 0: the process is killed
with SIGKILL (simulated with os.kill, so no Python traceback, no atexit, no
error file — exactly like an OOM kill).  Rank 0 is left waiting in the gradient
all-reduce.  ddp-doctor should name the signal and give the OOM hint; the
location can only be the rank's last known step (no marker line here).
"""
import datetime
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cache = []
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            out = model(xb)
            cache.append(out)  # leak: keeps every step's graph alive
            if rank == 1 and epoch == 0 and step == 6:
                os.kill(os.getpid(), signal.SIGKILL)  # the OOM killer strikes
            loss = nn.functional.cross_entropy(out, yb)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
