"""Two ranks pass a pair group they are not members of (DDP203 on ranks 1 and 2, at the line choosing the group).

4 ranks train one DDP model; every few steps each pair of ranks averages its loss over its pair's group
(`new_group([0, 1])`, `new_group([2, 3])`).  The pair is picked with `rank % 2` instead of `rank // 2`:
ranks 0 and 3 get their own pair, ranks 1 and 2 get the *other* pair, one they are not in.  torch makes a
collective on a group the rank is not a member of a no-op with a warning, so ranks 1 and 2 go on into the
next step's gradient all-reduce while ranks 0 and 3 wait in their pair's all_reduce for them: a hang.
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pair = pairs[rank % 2]  # expect: DDP203
    torch.manual_seed(0)

    x = torch.randn(256, 16)
    dataset = TensorDataset(x, (x[:, 0] > 0).long())
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=8, sampler=sampler)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for step, (xb, yb) in enumerate(loader):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            if step % 4 == 3:
                pair_loss = loss.detach().reshape(1)
                dist.all_reduce(pair_loss, group=pair)
                if rank % 2 == 0:
                    print(f"pair {rank // 2} epoch {epoch} step {step} loss {pair_loss.item() / 2:.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
