"""`broadcast_object_list` with lists of different lengths (DDP203): rank 0 broadcasts the names of the
files it found, the others pass a list sized by their own (different) guess.

torch broadcasts one size per list entry, so the lists must have the same length on every rank; a
per-rank list must be boxed as one object.  The twin, objects_boxed, broadcasts `[files]`.  Plain
torchrun: a gloo abort or a hang with no word of the lengths.
"""
import datetime
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    for step in range(5):
        x = torch.ones(4) * step
        dist.all_reduce(x)
    files = [f"shard-{i}.bin" for i in range(3)] if rank == 0 else [None, None]
    dist.broadcast_object_list(files, src=0)  # expect: DDP203
    print(f"rank {rank}: {len(files)} files", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
