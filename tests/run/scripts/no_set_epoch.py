"""Healthy but DistributedSampler.set_epoch() is never called (DDP102 warning); exit 0."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    dist.init_process_group("gloo")
    ds = TensorDataset(torch.randn(64, 8), torch.randn(64, 1))
    loader = DataLoader(ds, batch_size=8, sampler=DistributedSampler(ds))  # expect: DDP102
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(3):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
