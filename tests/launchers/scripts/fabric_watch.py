"""Lightning Fabric on 2 CPU processes with ddp_doctor.watch() at the top of the file: `fabric_watch.py MODE`.

`python fabric_watch.py`: `fabric.launch()` starts rank 1 itself (Lightning's subprocess launch of the same
command line); the started process becomes rank 0 inside it.
MODE: ok | barrier (rank 0 alone waits for everyone at step 5) | raise (rank 1 at step 5)."""
import ddp_doctor

ddp_doctor.watch()

import os
import sys

import torch
from lightning.fabric import Fabric

MODE = sys.argv[1]


def main():
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    fabric.launch()
    model = torch.nn.Linear(8, 2)
    model, opt = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    for step in range(20):
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
        opt.zero_grad()
        fabric.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
        if step == 5 and MODE == "barrier" and fabric.global_rank == 0:  # expect: barrier
            fabric.barrier()
        if step == 5 and MODE == "raise" and fabric.global_rank == 1:
            raise RuntimeError("rank 1 fails")  # expect: raise


if __name__ == "__main__":
    os.environ.setdefault("PL_TORCH_DISTRIBUTED_BACKEND", "gloo")
    main()
