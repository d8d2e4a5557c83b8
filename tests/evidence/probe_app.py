"""A 2-rank gloo job for tests/evidence: DDP steps, one all_gather, then each rank writes its probe's
published state (the exact wire text) to $OUT_DIR/rank<R>.json."""
import os

import torch
import torch.distributed as dist

from ddp_doctor.evidence import to_wire
from ddp_doctor.probe import activate
from ddp_doctor.probe.publisher import snapshot

probe = activate()
dist.init_process_group("gloo")
rank = dist.get_rank()
model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(3, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    opt.zero_grad()
    model(torch.randn(4, 3)).sum().backward()
    opt.step()
out = [torch.empty(2, 3, dtype=torch.float64) for _ in range(2)]
dist.all_gather(out, torch.ones(2, 3, dtype=torch.float64))  # GATHER_LINE
with open(os.path.join(os.environ["OUT_DIR"], f"rank{rank}.json"), "w") as f:
    f.write(to_wire(snapshot(probe.rec, with_stack=True)))
dist.barrier()
dist.destroy_process_group()
