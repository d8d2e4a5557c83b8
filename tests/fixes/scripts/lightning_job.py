"""2-rank Lightning DDP job on CPU; --uneven gives rank 1 fewer batches (an IterableDataset per rank)."""
import argparse
import json
import os
import warnings

import lightning as L
import torch
from torch.utils.data import DataLoader, IterableDataset

from ddp_doctor.fixes.lightning import DDPDoctorCallback, UnevenStepsError

warnings.filterwarnings("ignore")
p = argparse.ArgumentParser()
p.add_argument("--uneven", choices=["none", "iterable", "map"], default="none")
a = p.parse_args()
rank = int(os.environ["RANK"])


class Stream(IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield torch.randn(4), torch.randn(1)


class M(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(4, 1)

    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


if a.uneven == "iterable":
    loader = DataLoader(Stream(32 if rank == 0 else 20), batch_size=4)
elif a.uneven == "map":
    n = 32 if rank == 0 else 20
    loader = DataLoader(torch.utils.data.TensorDataset(torch.randn(n, 4), torch.randn(n, 1)), batch_size=4)
else:
    loader = DataLoader(Stream(24), batch_size=4)
cb = DDPDoctorCallback(timeout=3)
trainer = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=2, callbacks=[cb], logger=False,
                    enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                    use_distributed_sampler=False, limit_val_batches=0)
try:
    trainer.fit(M(), loader)
    out = {"ok": True, "steps": cb.steps_by_epoch}
except UnevenStepsError as e:
    out = {"ok": False, "error": str(e)}
print("RESULT", rank, json.dumps(out), flush=True)
os._exit(0 if out["ok"] else 7)
