"""Two ranks share one GPU over gloo with CUDA tensors (NCCL refuses two ranks on one GPU).

Clean by default: DDP training on cuda:0 on both ranks, then an all_reduce checked.  With ``--rank0-extra``
rank 0 alone calls an all_reduce of a CUDA tensor mid-training (DDP201).
``GPU_TEST_CPU=1`` runs the same job on the CPU (to check the test itself without a GPU)."""
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    cpu = os.environ.get("GPU_TEST_CPU") == "1"
    dev = torch.device("cpu") if cpu else torch.device("cuda", 0)  # the one GPU, shared
    if not cpu:
        torch.cuda.set_device(dev)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    extra = "--rank0-extra" in sys.argv[1:]
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).to(dev),
                device_ids=None if cpu else [0])
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(200 if extra else 40):
        loss = model(torch.randn(4, 8, device=dev)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if extra and step == 10 and rank == 0:  # expect: DDP201
            dist.all_reduce(torch.ones(4, device=dev))
    t = torch.full((4,), float(rank + 1), device=dev)
    dist.all_reduce(t)
    assert t.tolist() == [3.0] * 4, t
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
