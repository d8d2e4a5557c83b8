"""torch's agent restarts the job after rank 1 raises (``--max-restarts 1``), but the restarted ranks
share the launcher's rendezvous store, which still holds the failed attempt's gloo addresses: a rank
that connects to the last rank (slow to come back, beyond the connect retries) reads its old address
and fails.  Run without TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 this is DDP501 with that variable as the
fix (gloo decides per pair which side connects, so some runs restart fine)."""
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt > 0 and int(os.environ["RANK"]) == int(os.environ["WORLD_SIZE"]) - 1:
        time.sleep(15)  # e.g. a slower node: its new address is not yet in the store
    # (a stale address whose port another process has taken since can also block the connect: the
    # process-group timeout bounds that)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=20))  # expect: DDP501
    rank = dist.get_rank()
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(12):
        if step == 5 and rank == 1 and attempt == 0:
            raise RuntimeError("transient failure")  # expect: DDP204 (attempt 0)
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
