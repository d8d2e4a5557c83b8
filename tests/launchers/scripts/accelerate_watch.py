"""accelerate on 2 CPU processes with ddp_doctor.watch() at the top of the file: `accelerate_watch.py MODE
[notebook]`: started by `accelerate launch`, or (notebook) through accelerate.notebook_launcher from here.

MODE: ok | barrier (the main process alone waits for everyone at step 5) | raise (process 1 at step 5)."""
import ddp_doctor

ddp_doctor.watch()

import sys

import torch
from accelerate import Accelerator, notebook_launcher


def train(mode):
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    for step in range(20):
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
        if step == 5 and mode == "barrier" and accelerator.is_main_process:  # expect: barrier
            accelerator.wait_for_everyone()
        if step == 5 and mode == "raise" and accelerator.process_index == 1:
            raise RuntimeError("rank 1 fails")  # expect: raise


if __name__ == "__main__":
    if "notebook" in sys.argv[2:]:
        notebook_launcher(train, args=(sys.argv[1],), num_processes=2, master_addr="127.0.0.1",
                          use_port=sys.argv[3] if len(sys.argv) > 3 else "29500")
    else:
        train(sys.argv[1])
