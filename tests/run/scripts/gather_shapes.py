"""all_gather with a per-rank tensor length (DDP203): gloo aborts with EnforceNotMet."""
import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    for step in range(3):
        dist.all_reduce(torch.ones(4))
    preds = torch.zeros(10 + rank)
    out = [torch.zeros(10) for _ in range(world)]
    dist.all_gather(out, preds)  # expect: DDP203
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
