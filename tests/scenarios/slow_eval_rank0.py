"""A long, legitimate rank-0 evaluation while the other ranks wait at a barrier (clean twin: no false hang alarm).

Rank 0 evaluates the unwrapped model on a large validation set (~10 s: 200
batches with a slow metric) after each of the two epochs; rank 1 waits in the
barrier meanwhile.  Nothing is wrong: an adaptive hang detector must see rank 0
making progress and must not stop the job.
"""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

EVAL_BATCH_S = float(os.environ.get("EVAL_BATCH_S", 0.05))  # slow metric (e.g. BLEU / mAP) per batch


@torch.no_grad()
def evaluate(net, loader):
    net.eval()
    correct = total = 0
    for xb, yb in loader:
        correct += (net(xb).argmax(1) == yb).sum().item()
        total += len(yb)
        time.sleep(EVAL_BATCH_S)
    net.train()
    return correct / total


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    x = torch.randn(256 + 1600, 16)
    y = (x[:, 0] > 0).long()
    train_set = TensorDataset(x[:256], y[:256])
    sampler = DistributedSampler(train_set, shuffle=True, seed=0)
    loader = DataLoader(train_set, batch_size=16, sampler=sampler)
    val_loader = DataLoader(TensorDataset(x[256:], y[256:]), batch_size=8)

    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.CrossEntropyLoss()

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb in loader:
            opt.zero_grad()
            loss_fn(model(xb), yb).backward()
            opt.step()
        if rank == 0:
            t0 = time.perf_counter()
            acc = evaluate(model.module, val_loader)
            print(f"epoch {epoch} val acc {acc:.3f} ({time.perf_counter() - t0:.1f}s)", flush=True)
        dist.barrier()

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
