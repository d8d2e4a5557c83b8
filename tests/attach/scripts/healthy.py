"""A healthy 2-rank DDP job that trains for minutes: attach must not call it hung."""
import torch

from common import mark, setup, train_step


def main():
    rank, model, opt = setup()
    for step in range(10**7):
        train_step(model, opt, torch.randn(32, 8), torch.randint(0, 2, (32,)))
        if step == 20:
            mark("training")


if __name__ == "__main__":
    main()
