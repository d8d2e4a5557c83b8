"""Ray Train's TorchTrainer, 2 CPU workers on a local Ray, ddp_doctor.watch() at the top of the file:
`ray_watch.py MODE STORAGE`.  MODE: ok | barrier (world rank 0 alone at step 5) | raise (rank 1 at step 5)."""
import ddp_doctor

ddp_doctor.watch()

import sys

import ray
import torch
import torch.distributed as dist
from ray.train import RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, prepare_model


def train(config):
    model = prepare_model(torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rank = dist.get_rank()
    for step in range(20):
        opt.zero_grad()
        model(torch.randn(4, 8)).sum().backward()
        opt.step()
        if step == 5 and config["mode"] == "barrier" and rank == 0:  # expect: barrier
            dist.barrier()
        if step == 5 and config["mode"] == "raise" and rank == 1:
            raise RuntimeError("rank 1 fails")  # expect: raise


if __name__ == "__main__":
    ray.init(num_cpus=2, include_dashboard=False)
    trainer = TorchTrainer(train, train_loop_config={"mode": sys.argv[1]},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                           run_config=RunConfig(storage_path=sys.argv[2]))
    try:
        trainer.fit()
    finally:
        ray.shutdown()
