"""A sweep inside one job: builds a fresh DDP model, dataset, sampler and DataLoader ROUNDS times, training
each briefly and dropping it; prints the RSS growth between round 5 and the last round (MiB)."""
import gc
import os

import psutil
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def one_round():
    data = TensorDataset(torch.randn(512, 512), torch.randn(512, 1))  # 1 MiB of data
    sampler = DistributedSampler(data)
    loader = DataLoader(data, batch_size=64, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(512, 1024), nn.Linear(1024, 1)))  # 2 MiB of parameters (+ grads)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for epoch in range(2):
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()


def rss_mib() -> float:
    gc.collect()
    return psutil.Process().memory_info().rss / 2**20


def main():
    dist.init_process_group("gloo")
    rounds = int(os.environ.get("ROUNDS", "60"))
    for i in range(rounds):
        one_round()
        if i == 5:
            base = rss_mib()
    print(f"RSS_GROWTH_MIB {dist.get_rank()} {rss_mib() - base:.1f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
