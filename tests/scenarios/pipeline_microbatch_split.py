"""Two pipeline stages that pick the schedule's number of micro-batches from their own data (DDP203).

Each stage counts the real tokens of its own batch (its padding mask) and makes one micro-batch per 128
tokens: stage 0 splits each batch of 8 rows into 4 micro-batches of 2, stage 1 splits its targets into 2
micro-batches of 4.  The schedule's sends and receives pair micro-batch by micro-batch, so stage 1's loss
gets 2 rows of output for 4 rows of target and torch raises a batch-size ValueError in the loss: where it
shows.  Where the stages parted is the micro-batch count.  Plain torchrun: rank 1's ValueError, rank 0
killed while it waits in the schedule.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe


def padding_mask(rank: int) -> torch.Tensor:
    """This stage's view of its batch: 8 rows of 64 positions, the real tokens first."""
    lengths = torch.full((8,), 64 if rank == 0 else 32)
    return torch.arange(64)[None, :] < lengths[:, None]


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(rank)
    tokens = int(padding_mask(rank).sum())
    n_micro = max(1, tokens // 128)  # expect: DDP203
    stage = PipelineStage(torch.nn.Linear(8, 8), rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=n_micro, loss_fn=lambda out, y: F.cross_entropy(out, y))
    for _ in range(3):
        if rank == 0:
            schedule.step(torch.randn(8, 8))
        else:
            schedule.step(target=torch.randint(0, 8, (8,)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
