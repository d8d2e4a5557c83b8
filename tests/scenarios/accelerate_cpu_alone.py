"""accelerate on a CPU machine without ACCELERATE_USE_CPU=1: every process trains alone (DDP510).

Launched with 2 processes, `Accelerator()` finds no GPU and, not told to use
the CPU for distributed training, sets up a single-process job in each
process (DistributedType.NO, num_processes 1): no DDP wrapper, the DataLoader
is not sharded, not one collective.  It does initialise torch.distributed (a
group of 2 that is then never used).  Both processes train the same model on
the same data and exit 0.  The report must warn (never fail the job), at the
Accelerator() line.
"""
import os

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator()  # expect: DDP510
    torch.manual_seed(0)

    x = torch.randn(512, 16)
    y = (x[:, 0] > 0).long()
    loader = DataLoader(TensorDataset(x, y), batch_size=32, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, loader)

    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            accelerator.backward(loss)
            opt.step()
        print(f"process {accelerator.process_index} of {accelerator.num_processes} (RANK={os.environ.get('RANK')}): "
              f"epoch {epoch} loss {loss.item():.4f} ({len(loader)} steps)", flush=True)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
