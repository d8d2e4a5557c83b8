"""A correct job with two process groups of the same ranks: DDP on one, a metrics thread on the other.

Like Megatron's data-parallel group and its gloo twin: `new_group([0, 1])` twice.  The main thread trains
DDP over the first; a background thread all-reduces a throughput counter over the second every few
milliseconds.  Each group's calls are in the same order on every rank, but how the two interleave differs
between ranks - which is fine, they are different groups.  Keyed by their ranks alone, the two groups'
sequences merged and DDP's gradient all-reduce was paired with the thread's all_reduce.  Must be clean.
"""
import datetime
import os
import threading

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(os.environ.get("DDP_TIMEOUT", 90))))
    rank = dist.get_rank()
    train_group = dist.new_group([0, 1])
    metrics_group = dist.new_group([0, 1])
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 2)), process_group=train_group)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    done = threading.Event()

    def report_throughput():
        for _ in range(40):
            counter = torch.ones(1)
            dist.all_reduce(counter, group=metrics_group)
            done.wait(0.003 * (1 + rank))
    reporter = threading.Thread(target=report_throughput, name="metrics")
    reporter.start()
    for step in range(60):
        loss = model(torch.randn(32, 16)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    reporter.join()
    dist.barrier(group=train_group)
    print(f"rank {rank} done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
