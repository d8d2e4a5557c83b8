"""A collective hidden inside a helper that is only called under `if is_main_process():` (DDP201).

`save_checkpoint()` writes the file and then calls `dist.barrier()` "so nobody
reads a half-written checkpoint" — but the training loop only calls it on the
main process, so rank 0 sits in that barrier while rank 1 is already in the
next epoch's gradient all-reduce.
"""
import datetime
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def is_main_process():
    return not dist.is_initialized() or dist.get_rank() == 0


def save_checkpoint(model, epoch, path):
    torch.save({"model": model.module.state_dict(), "epoch": epoch}, path)
    dist.barrier()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    torch.manual_seed(0)
    ckpt = os.path.join(tempfile.gettempdir(), f"helper-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}.pt")

    x = torch.randn(256, 16)
    y = (x[:, 0] > 0).long()
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            opt.step()
        if is_main_process():  # expect: DDP201
            save_checkpoint(model, epoch, ckpt)
            print(f"epoch {epoch} saved, loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
