"""Rank 0 gets one more batch per epoch than rank 1 (home-made sharding): DDP101, gloo pairs silently."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(66, 8), torch.randn(66, 1))
    shard = torch.utils.data.Subset(data, list(range(rank * 34, min(66, rank * 34 + 34))))  # 34 vs 32 samples
    loader = DataLoader(shard, batch_size=2)  # expect: DDP101
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(4):
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
