"""Every rank's DataLoader worker blocks in __getitem__ (DDP205): nobody is in a collective."""
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 24:
            time.sleep(3600)  # expect: DDP205
        return torch.randn(8), torch.randn(1)


def main():
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    loader = DataLoader(Slow(), batch_size=4, num_workers=1)
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for x, y in loader:
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
