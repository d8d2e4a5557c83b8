"""Twin of accelerate_wait_main_only: the main process saves, every process calls `wait_for_everyone()`."""
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
        if accelerator.is_main_process:
            torch.save(accelerator.unwrap_model(model).state_dict(), path)
        accelerator.wait_for_everyone()
        print(f"process {accelerator.process_index} epoch {epoch} done", flush=True)


if __name__ == "__main__":
    main()
