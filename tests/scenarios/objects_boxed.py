"""`broadcast_object_list` of a per-rank list boxed as one object (clean twin of objects_list_lengths): every
rank passes a list of length 1, and rank 0's list of files arrives whole."""
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
    box = [[f"shard-{i}.bin" for i in range(3)]] if rank == 0 else [None]
    dist.broadcast_object_list(box, src=0)
    files = box[0]
    print(f"rank {rank}: {len(files)} files", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
