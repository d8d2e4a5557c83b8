"""Each rank averages its loss over its own pair group (`rank // 2`); the twin of pair_group_not_member.

4 ranks, pair groups `new_group([0, 1])` / `new_group([2, 3])`, every member of a pair in its all_reduce: OK.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pair = pairs[rank // 2]
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            if step % 4 == 3:
                pair_loss = loss.detach().reshape(1)
                dist.all_reduce(pair_loss, group=pair)
                if rank % 2 == 0:
                    print(f"pair {rank // 2} epoch {epoch} step {step} loss {pair_loss.item() / 2:.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
