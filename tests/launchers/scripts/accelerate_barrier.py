"""accelerate on 2 CPU processes; at step 5 only the main process waits for everyone (a rank-0-only barrier)."""
import torch
from accelerate import Accelerator


def main():
    accelerator = Accelerator(cpu=True)
    model = torch.nn.Linear(8, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    for step in range(1000):
        x, y = torch.randn(4, 8), torch.randint(0, 2, (4,))
        opt.zero_grad()
        accelerator.backward(torch.nn.functional.cross_entropy(model(x), y))
        opt.step()
        if step == 5:
            print(f"rank {accelerator.process_index} at step 5", flush=True)
        if step == 5 and accelerator.is_main_process:  # expect: DDP201 rank 0
            accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
