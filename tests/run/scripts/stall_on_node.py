"""Several nodes: DDP training; on the node started with STALL_HERE=1, local rank 1 stops at step 15 and
waits forever outside collectives (no CPU, no I/O, its stack unchanged) while every other rank waits for it
in the next collective.  Without STALL_HERE the job trains STEPS steps (default 2000: long enough for a
launcher to be killed mid-run; MARK_DIR: each rank creates MARK_DIR/rank<N> once it trains)."""
import os
import threading
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    stall = os.environ.get("STALL_HERE") == "1" and os.environ.get("LOCAL_RANK") == "1"
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(int(os.environ.get("STEPS", "2000"))):
        if step == 15 and stall:
            print(f"STALLING global rank {rank}", flush=True)
            threading.Event().wait()  # stuck here
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == 5:
            print(f"TRAINING global rank {rank}", flush=True)
            if os.environ.get("MARK_DIR"):  # a test waits for every rank to train
                open(os.path.join(os.environ["MARK_DIR"], f"rank{rank}"), "w").close()
        time.sleep(0.02)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
