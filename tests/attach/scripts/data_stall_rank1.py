"""Rank 1's dataset blocks in __getitem__ (num_workers=0: in the rank's own process); rank 0 waits in DDP's all-reduce."""
import os
import threading

import torch
from torch.utils.data import DataLoader, Dataset

from common import mark, setup, train_step

NEVER = threading.Event()


class Records(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i == 20 and os.environ["RANK"] == "1":
            mark("reading a record that never arrives")
            NEVER.wait()  # expect: DDP205 rank 1
        return torch.randn(8), i % 2


def main():
    rank, model, opt = setup()
    for x, y in DataLoader(Records(), batch_size=4):
        train_step(model, opt, x, y)


if __name__ == "__main__":
    main()
