"""Rank 0 gathers per-rank metrics with all_gather inside `if rank == 0`; rank 1 goes on to the epoch-end barrier."""
import torch
import torch.distributed as dist

from common import mark, setup, train_step


def log_metrics(rank, loss):
    if rank == 0:
        gathered = [torch.zeros(1) for _ in range(dist.get_world_size())]
        dist.all_gather(gathered, loss.reshape(1))  # expect: DDP203/DDP201 rank 0


def main():
    rank, model, opt = setup()
    for step in range(4):
        train_step(model, opt, torch.randn(4, 8), torch.randint(0, 2, (4,)))
    mark("epoch end")
    log_metrics(rank, torch.tensor(1.0))
    dist.barrier()


if __name__ == "__main__":
    main()
