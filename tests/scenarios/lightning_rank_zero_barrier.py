"""Lightning: a barrier inside a `@rank_zero_only` Callback hook (DDP201 on rank 0, at the callback's line).

An export callback writes the weights at the end of every epoch on rank 0 only
(`@rank_zero_only`, lightning.pytorch.utilities) and then calls
`trainer.strategy.barrier()` "so the other ranks wait for the file" — but the other
ranks never enter the hook: they go on into the next epoch, whose first collective is
Lightning's own per-batch broadcast, and then the gradient all-reduce.
Launched like any script under torchrun (Lightning reads the torchrun environment).
"""
import datetime
import os
import tempfile

import lightning as L
import torch
import torch.nn as nn
import torch.nn.functional as F
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.data import DataLoader, TensorDataset


class Classifier(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class ExportWeights(Callback):
    def __init__(self, path):
        self.path = path

    @rank_zero_only  # expect: DDP201
    def on_train_epoch_end(self, trainer, pl_module):
        torch.save(pl_module.state_dict(), self.path)
        trainer.strategy.barrier()


def main():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 16, generator=g)
    ds = TensorDataset(x, (x[:, 0] > 0).long())
    path = os.path.join(tempfile.gettempdir(), f"export-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}.pt")
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90)))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(process_group_backend="gloo", timeout=timeout),
                        max_epochs=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, callbacks=[ExportWeights(path)])
    trainer.fit(Classifier(), DataLoader(ds, batch_size=32))


if __name__ == "__main__":
    main()
