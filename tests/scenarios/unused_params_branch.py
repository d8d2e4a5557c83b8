"""A branch of forward that rank 1 never runs, in a DDP model built without find_unused_parameters (DDP204).

The box head runs only for batches with box annotations.  Only the even ids have
them, and DistributedSampler(shuffle=False) deals the even ids to rank 0 and the
odd ones to rank 1: rank 1 never runs `box_head`, so DDP never gets a gradient
for its two parameters there.  Its gradient all-reduce of the first iteration
never finishes; rank 1's second forward raises "Expected to have finished
reduction in the prior iteration ... Parameter indices which did not receive
grad for rank 1: 2 3" while rank 0 waits in its backward.  The report must name
`box_head.weight` / `box_head.bias` (module `box_head`, Linear), point at forward's branch
that uses `box_head` in one arm only, and name the DDP(...) line (find_unused_parameters=True).
"""
import datetime
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = nn.Sequential(nn.Linear(16, 32), nn.ReLU())
        self.box_head = nn.Linear(32, 4)
        self.cls_head = nn.Linear(32, 2)

    def forward(self, x, with_boxes):
        h = self.backbone(x)
        return self.cls_head(h), (self.box_head(h) if with_boxes else None)  # expect: DDP204


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    torch.manual_seed(0)

    n = 256
    x = torch.randn(n, 16)
    y = (x[:, 0] > 0).long()
    boxes = torch.rand(n, 4)
    annotated = torch.arange(n) % 2 == 0  # box annotations for the even ids only
    dataset = TensorDataset(x, y, boxes, annotated)
    sampler = DistributedSampler(dataset, shuffle=False)
    loader = DataLoader(dataset, batch_size=16, sampler=sampler)

    model = DDP(MultiTask())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    for epoch in range(2):
        sampler.set_epoch(epoch)
        for xb, yb, bb, ab in loader:
            opt.zero_grad()
            logits, pred_boxes = model(xb, with_boxes=bool(ab.all()))
            loss = F.cross_entropy(logits, yb)
            if pred_boxes is not None:
                loss = loss + F.smooth_l1_loss(pred_boxes, bb)
            loss.backward()
            opt.step()
        if rank == 0:
            print(f"epoch {epoch} loss {loss.item():.4f}", flush=True)

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
