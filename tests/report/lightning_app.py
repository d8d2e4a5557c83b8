"""A small Lightning job (2 CPU ranks, DDP) for `ddp-doctor run`."""
import os

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_epoch_end(self):
        if os.environ.get("LIT_BUG") and self.global_rank == 0:
            self.trainer.strategy.barrier()  # the bug: a barrier on rank 0 only

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 16, generator=g)
    ds = TensorDataset(x, (x[:, 0] > 0).long())
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), DataLoader(ds, batch_size=32))


if __name__ == "__main__":
    main()
