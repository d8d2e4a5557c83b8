"""Every rank's DataLoader workers poll for a shard file that never appears (num_workers=2)."""
import time
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from common import mark, setup, train_step


class Shards(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, i):
        if i >= 16:
            path = Path("/nonexistent/shard-sync") / f"{i // 16}.done"
            while not path.exists():
                time.sleep(0.05)  # expect: DDP205 worker
        return torch.randn(8), i % 2


def main():
    rank, model, opt = setup()
    loader = DataLoader(Shards(), batch_size=4, num_workers=2)
    for step, (x, y) in enumerate(loader):
        train_step(model, opt, x, y)
        if step == 3:
            mark("done with shard 0")


if __name__ == "__main__":
    main()
