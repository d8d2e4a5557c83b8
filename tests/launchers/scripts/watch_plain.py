"""A plain DDP script with ddp_doctor.watch(), as under mpirun/srun: `watch_plain.py MODE WHEN [INIT_METHOD]`.

MODE: ok | late (ok, and rank 1 goes on alone after the group is gone, past rank 0's end and with it the
side channel's store: its probe must let go of the store first) | barrier (rank 0 alone calls a barrier at
step 5) | raise (rank 1 raises at step 5).
WHEN: top (of the file) | after init_process_group | spawn (torch.multiprocessing.spawn starts both ranks from
here: the line at the top runs in the launching process and again as each child re-imports the file).
INIT_METHOD: e.g. tcp://127.0.0.1:PORT (no MASTER_* needed)."""
import sys

import ddp_doctor

if sys.argv[2] in ("top", "spawn"):
    ddp_doctor.watch()

import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

MODE, WHEN = sys.argv[1], sys.argv[2]
INIT = sys.argv[3] if len(sys.argv) > 3 else "env://"
LATE_S = 14.0  # > rank 0's wait for the others' ends (session.embedded.FINAL_WAIT_S) + its store's let-go


def main(spawned_rank=None):
    if spawned_rank is not None:  # mp.spawn: the rank is the function's argument (no RANK/WORLD_SIZE anywhere)
        dist.init_process_group("gloo", rank=spawned_rank, world_size=2)
    elif INIT.startswith("tcp://"):  # mpirun-style: the script passes its rank (no MASTER_* in the environment)
        dist.init_process_group("gloo", init_method=INIT, rank=int(os.environ["RANK"]),
                                world_size=int(os.environ["WORLD_SIZE"]))
    else:
        dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(8, 2))
    if WHEN == "after":
        assert ddp_doctor.watch() and ddp_doctor.watch()  # idempotent
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(20):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        if step == 5:
            print(f"rank {rank} at step 5", flush=True)
        if step == 5 and MODE == "barrier" and rank == 0:  # expect: barrier
            dist.barrier()
        if step == 5 and MODE == "raise" and rank == 1:
            raise RuntimeError("rank 1 fails")  # expect: raise
    dist.destroy_process_group()
    if MODE == "late" and rank == 1:
        import time

        time.sleep(LATE_S)


if __name__ == "__main__":
    if WHEN == "spawn":
        import torch.multiprocessing as mp

        mp.spawn(main, nprocs=2)
    else:
        main()
