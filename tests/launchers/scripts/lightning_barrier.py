"""Lightning DDP on 2 CPU processes; at batch 5 rank 0 alone calls a barrier (in on_train_batch_end)."""
import os

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


class Model(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if batch_idx == 5:
            print(f"rank {self.global_rank} at batch 5", flush=True)
        if batch_idx == 5 and self.global_rank == 0:  # expect: DDP201 rank 0
            dist.barrier()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main():
    ds = TensorDataset(torch.randn(512, 8), torch.randint(0, 2, (512,)))
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(Model(), DataLoader(ds, batch_size=8))


if __name__ == "__main__":
    os.environ.setdefault("PL_TORCH_DISTRIBUTED_BACKEND", "gloo")
    main()
