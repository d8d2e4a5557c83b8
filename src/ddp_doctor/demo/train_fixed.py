"""The fixed seed-000 job: rank 0 validates the unwrapped model (model.module), which runs no
collective, so the other rank is not left waiting.  Run it with 2 ranks:

    ddp-doctor run --nproc-per-node 2 train_fixed.py
"""
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def make_dataset(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 16, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def validate(model, loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for x, y in loader:
            total += F.cross_entropy(model(x), y).item()
    model.train()
    return total / len(loader)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.BatchNorm1d(32), nn.ReLU(), nn.Linear(32, 2))
    model = DDP(net)
    train_set = make_dataset(512, seed=1)
    sampler = DistributedSampler(train_set)
    train_loader = DataLoader(train_set, batch_size=32, sampler=sampler, num_workers=1, persistent_workers=True)
    val_loader = DataLoader(make_dataset(128, seed=2), batch_size=32)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(3):
        sampler.set_epoch(epoch)
        for x, y in train_loader:
            opt.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
        if rank == 0:
            val_loss = validate(model.module, val_loader)  # the fix: the unwrapped model
            print(f"epoch {epoch}: train loss {loss.item():.3f}, val loss {val_loss:.3f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
