"""A mixture-of-experts step: token counts exchanged first, then the tokens, with per-rank split sizes (clean).

Each rank routes a different number of tokens to each expert rank, so the two ranks' `all_to_all_single`
tensors have different sizes by design: torch requires only that what rank a sends to rank b is what rank
b expects from rank a, which the count exchange guarantees.
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
        tokens = torch.randn(16 + 4 * rank + step % 3, 8)
        route = torch.randint(0, world, (len(tokens),))
        order = torch.argsort(route)
        send = torch.bincount(route, minlength=world)
        recv = torch.empty_like(send)
        dist.all_to_all_single(recv, send)
        arrived = torch.empty(int(recv.sum()), 8)
        dist.all_to_all_single(arrived, tokens[order], output_split_sizes=recv.tolist(),
                               input_split_sizes=send.tolist())
        out = experts(arrived)
        back = torch.empty(len(tokens), 8)
        dist.all_to_all_single(back, out.detach(), output_split_sizes=send.tolist(), input_split_sizes=recv.tolist())
        loss = torch.zeros(1) + back.sum().item()
        dist.all_reduce(loss)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
