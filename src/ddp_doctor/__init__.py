"""ddp-doctor: find, explain and prevent the failures that hang, desync or slow PyTorch DDP training."""

__version__ = "0.1.0"
