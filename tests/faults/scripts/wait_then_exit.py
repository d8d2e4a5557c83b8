"""One process under the probe: trains a few steps, waits for the file named by GO_FILE, then ends
(normally, or with an exception when END=raise) and prints the time it ended."""
import os
import sys
import time

import torch

model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(5):
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
print("READY", flush=True)
while not os.path.exists(os.environ["GO_FILE"]):
    time.sleep(0.05)
print(f"END {time.time():.3f}", flush=True)
if os.environ.get("END") == "raise":
    raise RuntimeError("the user's own error")
sys.exit(0)
