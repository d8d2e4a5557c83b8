"""Lightning on 2 CPU processes with ddp_doctor.watch() at the top of the file: `lightning_watch.py MODE STRATEGY`.

STRATEGY: ddp (Lightning's own subprocess launch of `python lightning_watch.py`: the started process becomes
rank 0 inside Trainer.fit) | ddp_spawn (both ranks spawned children).
MODE: ok | barrier (a callback's barrier at the end of the first epoch, on rank 0 alone) | raise (rank 1 at batch 5)."""
import ddp_doctor

ddp_doctor.watch()

import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

MODE, STRATEGY = sys.argv[1], sys.argv[2]


class BarrierOnRankZero(L.Callback):
    def on_train_epoch_end(self, trainer, pl_module):
        if MODE == "barrier" and trainer.is_global_zero:  # expect: barrier
            trainer.strategy.barrier()


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 5 and MODE == "raise" and self.global_rank == 1:
            raise RuntimeError("rank 1 fails")  # expect: raise

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    ds = TensorDataset(torch.randn(160, 8), torch.randint(0, 2, (160,)))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=STRATEGY, max_epochs=2, logger=False,
                        callbacks=[BarrierOnRankZero()],
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), DataLoader(ds, batch_size=8))


if __name__ == "__main__":
    os.environ.setdefault("PL_TORCH_DISTRIBUTED_BACKEND", "gloo")
    main()
