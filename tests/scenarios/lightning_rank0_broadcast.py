"""Lightning: a broadcast only rank 0 makes, in a LightningModule hook (DDP201 on rank 0, at the hook).

Every 4 batches rank 0 picks a learning rate from its own loss and shares it with
`self.trainer.strategy.broadcast(...)` — inside `if self.trainer.is_global_zero:`.
The other rank goes on into Lightning's next batch, whose first collective is
Lightning's own per-batch broadcast (inside `trainer.fit`): gloo pairs rank 0's
object broadcast with it, and the job hangs in the next gradient all-reduce.
Launched like any script under torchrun (Lightning reads the torchrun environment).
"""
import datetime
import os

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
        self.lr = 0.1

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.trainer.is_global_zero and batch_idx % 4 == 3:  # expect: DDP201
            proposal = 0.1 if outputs["loss"].item() > 0.5 else 0.05
            self.lr = self.trainer.strategy.broadcast(proposal, src=0)
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] = self.lr

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def main():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    ds = TensorDataset(x, (x[:, 0] > 0).long())
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90)))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo", timeout=timeout),
                        max_epochs=2, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)
    trainer.fit(Classifier(), DataLoader(ds, batch_size=32))


if __name__ == "__main__":
    main()
