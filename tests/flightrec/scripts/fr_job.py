"""A 2-rank gloo job with Flight Recorder on (TORCH_FR_BUFFER_SIZE); CASE picks the bug.  The process group
times out after 3 s; each rank then writes its recorder with ddp_doctor.flightrec.write_dump (gloo does not
dump by itself) into TORCH_FR_DUMP_TEMP_FILE<rank>."""
import datetime
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_doctor.flightrec import write_dump


def train(model, rank, case):
    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
        if case == "barrier" and step == 1 and rank == 0:  # expect: barrier
            dist.barrier()
    if case == "broadcast_size":
        dist.broadcast(torch.ones(4 + 4 * rank), src=0)  # expect: broadcast_size
    if case == "op":
        if rank == 0:  # expect: op decision
            dist.all_gather([torch.zeros(3) for _ in range(2)], torch.ones(3))  # expect: op rank 0
        else:
            dist.all_reduce(torch.ones(3))  # expect: op rank 1
    if case == "allgather_shape":
        dist.all_gather([torch.zeros(3 + rank) for _ in range(2)], torch.ones(3 + rank))  # expect: allgather_shape
    dist.barrier()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 2))
    try:
        train(model, rank, sys.argv[1])
    except RuntimeError as e:
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    write_dump()


if __name__ == "__main__":
    main()
