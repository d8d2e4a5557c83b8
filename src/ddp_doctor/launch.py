"""Launch ranks through torch's own elastic launcher, with a ddp-doctor entry module in front.

``ddp-doctor run`` and ``ddp-doctor check`` accept torchrun's options verbatim;
this module parses them with torchrun's own parser and runs
``python -m ENTRY_MODULE [-m] SCRIPT ARGS...`` in every rank via
``torch.distributed.run.run`` so rendezvous, restarts and multi-node behave
exactly as under torchrun.
"""
from __future__ import annotations

import argparse


def parse_torchrun_args(argv: list[str]) -> argparse.Namespace:
    """Parse ``[torchrun options] SCRIPT [ARGS...]`` exactly as torchrun does."""
    from torch.distributed import run as torchrun

    return torchrun.parse_args(argv)


def launch(args: argparse.Namespace, entry_module: str) -> None:
    """Run ``args`` (from :func:`parse_torchrun_args`) with ``entry_module`` in front of the user's program.

    Every rank runs ``python -u -m entry_module [-m] SCRIPT ARGS...``; the entry
    module is responsible for running the user's script as ``__main__``.
    Raises torch's ``ChildFailedError`` when a rank fails, as torchrun does.
    """
    from torch.distributed import run as torchrun

    if args.no_python or args.run_path:
        raise ValueError("--no-python and --run-path cannot be combined with ddp-doctor's entry module")
    user_program = (["-m"] if args.module else []) + [args.training_script]
    args = argparse.Namespace(**vars(args))
    args.module = True
    args.training_script = entry_module
    args.training_script_args = user_program + list(args.training_script_args)
    torchrun.run(args)
