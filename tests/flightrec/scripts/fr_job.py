"""A 2-rank gloo job with Flight Recorder on (TORCH_FR_BUFFER_SIZE) whose ranks broadcast tensors of different
sizes (gloo pairs them silently).  The process group times out after 3 s; each rank then writes its recorder
with ddp_doctor.flightrec.write_dump (gloo does not dump by itself) into TORCH_FR_DUMP_TEMP_FILE<rank>.
(The rank-0 barrier, the mismatched collective and the rank that died are the parity jobs of tests/parity.)"""
import datetime

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_doctor.flightrec import write_dump


def train(model, rank):
    for step in range(3):
        model(torch.randn(2, 4)).sum().backward()
    dist.broadcast(torch.ones(4 + 4 * rank), src=0)  # expect: broadcast_size
    dist.barrier()


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank = dist.get_rank()
    model = DDP(nn.Linear(4, 2))
    try:
        train(model, rank)
    except RuntimeError as e:
        print(f"rank {rank}: {type(e).__name__}: {str(e)[:120]}", flush=True)
    write_dump()


if __name__ == "__main__":
    main()
