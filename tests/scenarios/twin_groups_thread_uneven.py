"""Two process groups of the same ranks, DDP on one, a metrics thread on the other - and the thread's count
is rank-local (DDP201 at the `for`): rank 1's thread all-reduces once more than rank 0's, so it waits in
the metrics group's all_reduce for a partner whose thread has ended, while rank 0 waits in the final
barrier on the training group (a wait cycle).  The culprit is rank 1's thread, not rank 0's barrier.
Twin of twin_groups_thread (both ranks' threads make the same number of calls)."""
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
        for _ in range(40 + rank):  # expect: DDP201
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
