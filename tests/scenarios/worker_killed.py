"""A DataLoader worker of rank 1 is SIGKILLed (OOM-killed while decoding a huge sample) (DDP204).

Rank 1's worker dies by SIGKILL on one sample; the DataLoader's SIGCHLD handler
in rank 1's main process raises "DataLoader worker (pid N) is killed by signal:
Killed." wherever the main thread happens to be (observed: inside backward),
so rank 1 exits with an error while rank 0 waits in the gradient all-reduce.
The cause to report: rank 1, its loader worker killed by SIGKILL (likely OOM),
at the DataLoader(...) line that made the worker, with the worker's pid; the
line where the error surfaces in the main process is timing-dependent and not
the cause.
"""
import datetime
import os
import signal

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler


class Images(Dataset):
    def __init__(self, n=256):
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.huge = {81}  # a 40k x 40k image in rank 1's shard (shuffle=False, its 6th batch)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        if i in self.huge:
            os.kill(os.getpid(), signal.SIGKILL)  # what the OOM killer does to the worker decoding it
        return self.x[i], int(self.x[i, 0] > 0)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    ds = Images()
    sampler = DistributedSampler(ds, shuffle=False)
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=2)  # expect: DDP204

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        print(f"rank {rank} epoch {epoch} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
