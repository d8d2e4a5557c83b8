"""The twin of pipeline_microbatch_split: the stages agree on the micro-batch count before building the
schedule (the smallest of their own counts, by all_reduce MIN), so every stage splits alike: exits 0."""
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
    n = torch.tensor([max(1, tokens // 128)])
    dist.all_reduce(n, op=dist.ReduceOp.MIN)  # every stage splits alike
    stage = PipelineStage(torch.nn.Linear(8, 8), rank, 2, torch.device("cpu"))
    schedule = ScheduleGPipe(stage, n_microbatches=int(n), loss_fn=lambda out, y: F.cross_entropy(out, y))
    for _ in range(3):
        if rank == 0:
            schedule.step(torch.randn(8, 8))
        else:
            schedule.step(target=torch.randint(0, 8, (8,)))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
