"""accelerate on a CPU machine told to use the CPU (clean twin of accelerate_cpu_alone.py).

`Accelerator(cpu=True)` (what ACCELERATE_USE_CPU=1 / `accelerate launch --cpu`
set) makes a MULTI_CPU job: one gloo group of 2, the model wrapped in DDP, the
DataLoader sharded between the processes.  Must be reported clean, with no
DDP510.
"""
import os

import torch
import torch.nn as nn
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset


def main():
    accelerator = Accelerator(cpu=True)
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
