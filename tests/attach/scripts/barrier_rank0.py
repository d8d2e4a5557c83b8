"""Rank 0 saves a checkpoint and calls barrier() inside `if rank == 0`; rank 1 trains on and waits in DDP's all-reduce."""
import torch
import torch.distributed as dist

from common import mark, setup, train_step


def main():
    rank, model, opt = setup()
    for step in range(1000):
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
        train_step(model, opt, x, y)
        if step == 5:
            mark("at step 5")
        if step == 5 and rank == 0:
            torch.save(model.module.state_dict(), "/dev/null")
            dist.barrier()  # expect: DDP201 rank 0


if __name__ == "__main__":
    main()
