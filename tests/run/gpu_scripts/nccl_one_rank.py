"""World size 1 on NCCL: DDP training, then a synchronous all_reduce of a CUDA tensor.

NCCL queues a collective on a CUDA stream and returns; the probe must keep it issued until its work
completes and then show it as the last collective.  Rank 0 writes what the probe saw to argv[1].
``GPU_TEST_CPU=1`` runs the same job on gloo and the CPU (to check the test itself without a GPU)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

CPU = os.environ.get("GPU_TEST_CPU") == "1"
local_rank = int(os.environ["LOCAL_RANK"])
dev = torch.device("cpu") if CPU else torch.device("cuda", local_rank)
if not CPU:
    torch.cuda.set_device(dev)
dist.init_process_group("gloo" if CPU else "nccl")
model = DDP(nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 1)).to(dev),
            device_ids=None if CPU else [local_rank])
opt = torch.optim.SGD(model.parameters(), lr=0.01)
for step in range(30):
    loss = model(torch.randn(32, 64, device=dev)).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
t = torch.full((4,), 2.0, device=dev)
dist.all_reduce(t)  # the synchronous call
from ddp_doctor.probe import hooks  # noqa: E402
from ddp_doctor.probe.publisher import snapshot  # noqa: E402

if not CPU:
    torch.cuda.synchronize()
t_end = time.time() + 10
st = snapshot(hooks.REC)
while st.in_collective is not None and time.time() < t_end:  # the probe polls the work: give it a moment
    time.sleep(0.05)
    st = snapshot(hooks.REC)
out = {"backend": dist.get_backend(), "after_sync": st.in_collective.to_json() if st.in_collective else None,
       "last": st.last_collective.to_json() if st.last_collective else None, "sum": t.tolist()}
with open(sys.argv[1], "w") as f:
    json.dump(out, f)
dist.destroy_process_group()
