"""Two pipeline stages that run the schedule a different number of times (DDP201).

Each stage counts its batches from its own data: stage 0 (rank 0) has one batch more, so it calls the
schedule's `step` a fourth time.  Its point-to-point sends wait for stage 1, which has left the loop and
waits in the barrier after it.  Nothing is a collective mismatch: the sends and receives are not numbered
with the barrier.  Plain torchrun: a silent hang until the process-group timeout.
"""
import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    stage = PipelineStage(torch.nn.Linear(8, 8), rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda out, target: (out - target).pow(2).mean())
    batches = 4 if rank == 0 else 3  # each stage's own count of its data  # expect: DDP201
    for _ in range(batches):
        if rank == 0:
            schedule.step(torch.randn(4, 8))
        else:
            schedule.step(target=torch.randn(4, 8))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
