"""2 ranks iterate an IterableDataset loader whose __len__ undercounts what it yields (legal; torch warns
only when someone has asked len(loader)).  Run under PYTHONWARNINGS=error."""
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, IterableDataset


class Stream(IterableDataset):
    def __len__(self):
        return 4  # an estimate; the stream yields more

    def __iter__(self):
        g = torch.Generator().manual_seed(dist.get_rank())
        for _ in range(12):
            yield torch.randn(8, generator=g), torch.randn(1, generator=g)


def main():
    dist.init_process_group("gloo")
    model = DDP(nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Stream(), batch_size=2)
    for epoch in range(2):
        for x, y in loader:
            loss = (model(x) - y).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
    dist.destroy_process_group()
    print("TRAINING DONE", flush=True)


if __name__ == "__main__":
    main()
