"""Seed 002 on real GPUs: every rank loads a checkpoint saved from cuda:0 without map_location (DDP301)."""
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
path = os.environ["CKPT"]
if dist.get_rank() == 0:
    torch.save({"w": torch.randn(2048, 2048, device="cuda:0")}, path)
dist.barrier()
ckpt = torch.load(path, weights_only=True)  # expect: DDP301 (tensors land on cuda:0 on every rank)
model = DDP(torch.nn.Linear(64, 64).cuda(), device_ids=[local_rank])
opt = torch.optim.SGD(model.parameters(), lr=0.1)
t_end = time.time() + 12  # long enough for the NVML sampler (every 5 s) to see the contexts
while time.time() < t_end:
    model(torch.randn(32, 64, device="cuda")).sum().backward()
    opt.step()
    opt.zero_grad()
dist.destroy_process_group()
