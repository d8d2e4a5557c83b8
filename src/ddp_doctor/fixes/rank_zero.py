"""rank_zero_first(): the barrier done right."""
from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch.distributed as dist

from ddp_doctor.fixes import _dist

__all__ = ["rank_zero_first", "RankZeroFailed"]


class RankZeroFailed(RuntimeError):
    """Raised on the waiting ranks when the body failed on a rank that ran it first (or on another rank)."""


def _max_flag(value: int, group) -> int:
    t = _dist.int_tensor([value], group)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return int(t.item())


@contextlib.contextmanager
def rank_zero_first(local: bool = False, group=None) -> Iterator[None]:
    """Run the body on rank 0 first (download, preprocess, build a cache), then on the other ranks.

    The usual hand-written version -- ``if rank != 0: barrier()`` before and
    ``if rank == 0: barrier()`` after -- hangs every other rank forever when
    rank 0's body raises (they wait in a barrier rank 0 never reaches).  Here
    the barrier carries a status: the waiting ranks receive rank 0's outcome
    and raise :class:`RankZeroFailed` instead of hanging, and after the other
    ranks ran the body, all ranks agree on whether anyone failed (so rank 0
    does not train on alone).

    ``local=True``: the first rank *of each node* (``LOCAL_RANK == 0``) runs
    first -- for data on node-local disks.

    Example::

        with rank_zero_first():
            ds = torchvision.datasets.CIFAR10(root, download=True)   # downloads once

    Collective: every rank of ``group`` must enter it.  The waiting ranks wait
    up to the process group's timeout (``init_process_group(timeout=...)``):
    raise it when the body is a long download.
    """
    if not _dist.active(group):
        yield
        return
    if local:
        first = int(os.environ.get("LOCAL_RANK", _dist.rank(group))) == 0
    else:
        first = _dist.rank(group) == 0
    who = "the first rank of each node" if local else "rank 0"
    if first:
        try:
            yield
        except BaseException:
            # tell the waiting ranks, then fail here with the original error
            _max_flag(1, group)
            raise
        _max_flag(0, group)      # release the others
        if _max_flag(0, group):  # wait for their outcome
            raise RankZeroFailed(f"rank_zero_first: the body failed on another rank after {who} ran it")
    else:
        if _max_flag(0, group):
            raise RankZeroFailed(f"rank_zero_first: the body failed on {who}; not running it here")
        failed = False
        try:
            yield
        except BaseException:
            failed = True
            _max_flag(1, group)
            raise
        finally:
            if not failed:
                if _max_flag(0, group):
                    raise RankZeroFailed("rank_zero_first: the body failed on another rank")
