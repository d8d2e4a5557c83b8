"""Two pipeline stages that agree on the number of batches before the loop (clean twin of
pipeline_steps_uneven): every stage runs the schedule's `step` as many times as the others."""
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
    batches = torch.tensor([4 if rank == 0 else 3])  # each stage's own count of its data
    dist.all_reduce(batches, op=dist.ReduceOp.MIN)  # agreed: the batches every stage has
    batches = int(batches)
    for _ in range(batches):
        if rank == 0:
            schedule.step(torch.randn(4, 8))
        else:
            schedule.step(target=torch.randn(4, 8))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
