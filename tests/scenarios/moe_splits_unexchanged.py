"""A mixture-of-experts step that never exchanges its token counts (DDP203): `all_to_all_single` split sizes
that disagree between ranks.

Each rank routes its tokens to the expert ranks and passes its own per-destination counts as both the
input and the output split sizes, as if every rank received what it sends.  What rank a sends to rank b
must be what rank b expects from rank a; here it is not.  The twin, moe_all_to_all, exchanges the counts
first with a small all_to_all_single.  Plain torchrun: gloo aborts a rank (or a hang), with no word of which
rank sends how many rows to whom.
"""
import datetime
import os

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(rank)
    experts = torch.nn.Linear(8, 8)
    for step in range(20):
        tokens = torch.randn(16 + 4 * rank, 8)
        route = torch.arange(len(tokens)) % world if rank == 0 else (torch.arange(len(tokens)) < 6).long()
        order = torch.argsort(route)
        send = torch.bincount(route, minlength=world).tolist()
        arrived = torch.empty(sum(send), 8)
        dist.all_to_all_single(arrived, tokens[order], output_split_sizes=send,  # expect: DDP203
                               input_split_sizes=send)
        out = experts(arrived)
        loss = torch.zeros(1) + out.sum().item()
        dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
