"""A rank that waits half a minute on something outside the job, then carries on (clean: never stopped).

After epoch 0 rank 1 asks a remote evaluation service for a score and blocks
for ~25 s on the answer: no CPU, no I/O, the same Python line.  Rank 0 waits
at the barrier meanwhile.  Under plain torchrun the job exits 0 (the process
group's timeout is 90 s).  A doctor may warn that rank 1 keeps rank 0 waiting,
but must not stop a job because one rank was idle for 25 s.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

REMOTE_EVAL_S = float(os.environ.get("REMOTE_EVAL_S", 25))


def remote_eval_score(epoch):
    """Stands in for a blocking call to a remote eval service (the answer takes REMOTE_EVAL_S)."""
    time.sleep(REMOTE_EVAL_S)
    return 0.5 + 0.1 * epoch


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
        if rank == 1 and epoch == 0:
            print(f"rank 1: remote eval score {remote_eval_score(epoch):.2f}", flush=True)
        dist.barrier()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
