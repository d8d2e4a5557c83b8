"""Twin of lightning_rank0_broadcast and lightning_rank_zero_barrier: the same work, collectives on every rank.

Every rank enters `strategy.broadcast(...)` (only rank 0's proposal is kept), and the
export callback writes the file under `if trainer.is_global_zero:` but calls
`trainer.strategy.barrier()` on every rank.
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
        if batch_idx % 4 == 3:
            proposal = 0.1 if outputs["loss"].item() > 0.5 else 0.05
            self.lr = self.trainer.strategy.broadcast(proposal, src=0)
            for group in self.trainer.optimizers[0].param_groups:
                group["lr"] = self.lr

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr)


class ExportWeights(Callback):
    def __init__(self, path):
        self.path = path

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.is_global_zero:
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
