"""accelerate: `accelerator.wait_for_everyone()` called on the main process only (DDP201 on rank 0, at that line).

At the end of each epoch the main process saves the unwrapped model and then calls
`wait_for_everyone()` "so nobody reads a half-written file" — inside
`if accelerator.is_main_process:`.  The other process goes on into the next epoch: its
prepared DataLoader synchronises the RNG states (a broadcast inside `for ... in loader`)
and then all-reduces gradients, while the main process waits in its barrier.
Launched like any script under torchrun (accelerate reads the torchrun environment).
"""
import datetime
import os
import tempfile

import torch
import torch.nn as nn
from accelerate import Accelerator
from accelerate.utils import InitProcessGroupKwargs
from torch.utils.data import DataLoader, TensorDataset


def main():
    timeout = datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90)))
    accelerator = Accelerator(cpu=True, kwargs_handlers=[InitProcessGroupKwargs(backend="gloo", timeout=timeout)])
    torch.manual_seed(0)
    x = torch.randn(256, 16)
    loader = DataLoader(TensorDataset(x, (x[:, 0] > 0).long()), batch_size=16, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    path = os.path.join(tempfile.gettempdir(), f"acc-{os.environ.get('TORCHELASTIC_RUN_ID', 'local')}.pt")

    for epoch in range(3):
        for xb, yb in loader:
            opt.zero_grad()
            accelerator.backward(nn.functional.cross_entropy(model(xb), yb))
            opt.step()
        if accelerator.is_main_process:  # expect: DDP201
            torch.save(accelerator.unwrap_model(model).state_dict(), path)
            accelerator.wait_for_everyone()
        print(f"process {accelerator.process_index} epoch {epoch} done", flush=True)


if __name__ == "__main__":
    main()
