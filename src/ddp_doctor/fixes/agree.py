"""Decide together: skip a step, stop training, or go on -- on every rank or on none.

A rank that skips a step (NaN loss, filtered batch) or stops early on its own
leaves the others waiting in the next gradient all-reduce forever (DDP101 /
DDP201).  The cure is one tiny all-reduce of the local decision, so every rank
takes the same branch.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

from ddp_doctor.fixes import _dist

__all__ = ["agree", "skip_if_nonfinite", "EarlyStopping"]


def agree(flag, op: str = "any", group=None) -> bool:
    """Return the same decision on every rank of ``group``.

    ``op="any"``: True on all ranks if ``flag`` is true on at least one rank
    (use it for "skip this step" / "stop now" -- the safe choice when one rank
    has a reason to stop).  ``op="all"``: True only if it is true on every rank.

    Costs one all-reduce of one integer (a collective: call it on every rank,
    at the same point).  Without an initialised process group (single process)
    it returns ``bool(flag)``.

    Example::

        stop = agree(time.time() > deadline)      # clocks differ between ranks
        if stop:
            break                                 # every rank breaks together
    """
    if op not in ("any", "all"):
        raise ValueError(f"op must be 'any' or 'all', not {op!r}")
    if isinstance(flag, torch.Tensor):
        local = bool(flag.any().item()) if op == "any" else bool(flag.all().item())
    else:
        local = bool(flag)
    if not _dist.active(group):
        return local
    t = _dist.int_tensor([int(local)], group)
    dist.all_reduce(t, op=dist.ReduceOp.MAX if op == "any" else dist.ReduceOp.MIN, group=group)
    return bool(t.item())


def skip_if_nonfinite(loss, group=None) -> bool:
    """True on every rank when the loss is NaN/Inf on at least one rank.

    The cure for the rank-local NaN skip: ``if not torch.isfinite(loss): continue``
    on one rank makes it skip ``backward()`` -- and its gradient all-reduce --
    while the others wait for it.  Call this on every rank *before* backward::

        loss = criterion(model(x), y)
        if skip_if_nonfinite(loss):
            optimizer.zero_grad(set_to_none=True)
            continue                      # all ranks skip this step together
        loss.backward()

    ``loss`` may be a tensor (any shape) or a Python number.  On CUDA this
    reads one flag back to the host (a synchronisation per step, usually
    negligible next to the gradient all-reduce).
    """
    if isinstance(loss, torch.Tensor):
        local = not bool(torch.isfinite(loss.detach()).all().item())
    else:
        local = not math.isfinite(float(loss))
    return agree(local, "any", group=group)


class EarlyStopping:
    """Early stopping that stops every rank at the same epoch.

    Stopping on a rank-local validation metric lets one rank leave the training
    loop while the others wait in the next all-reduce.  Here the metric is
    averaged across ranks first (``reduce="mean"``; one all-reduce) and the
    decision itself is agreed (``agree(..., "any")``), so all ranks see the same
    answer even if their metrics were computed on different shards.

    Example::

        stopper = EarlyStopping(patience=3, mode="min")
        for epoch in range(100):
            train_one_epoch()
            val_loss = evaluate()                 # on every rank, on its shard
            if stopper.step(val_loss):
                break                             # all ranks together

    ``step`` is a collective: call it on every rank each time.
    """

    def __init__(self, patience: int = 5, mode: str = "min", min_delta: float = 0.0,
                 reduce: str | None = "mean", group=None):
        if mode not in ("min", "max"):
            raise ValueError("mode must be 'min' or 'max'")
        if reduce not in ("mean", None):
            raise ValueError("reduce must be 'mean' or None")
        self.patience = int(patience)
        self.mode = mode
        self.min_delta = float(min_delta)
        self.reduce = reduce
        self.group = group
        self.best: float | None = None
        self.bad_epochs = 0
        self.should_stop = False

    def _global_metric(self, metric) -> float:
        value = float(metric.detach().float().mean().item()) if isinstance(metric, torch.Tensor) else float(metric)
        if self.reduce == "mean" and _dist.active(self.group):
            t = torch.tensor([value], dtype=torch.float64, device=_dist.comm_device(self.group))
            dist.all_reduce(t, group=self.group)
            value = float(t.item()) / _dist.world_size(self.group)
        return value

    def _improved(self, value: float) -> bool:
        if self.best is None or math.isnan(self.best):
            return not math.isnan(value)
        if self.mode == "min":
            return value < self.best - self.min_delta
        return value > self.best + self.min_delta

    def step(self, metric) -> bool:
        """Record this epoch's metric; return True (on every rank) when training should stop."""
        value = self._global_metric(metric)
        if self._improved(value):
            self.best = value
            self.bad_epochs = 0
        else:
            self.bad_epochs += 1
        local_stop = self.bad_epochs >= self.patience or math.isnan(value)
        self.should_stop = agree(local_stop, "any", group=self.group)
        return self.should_stop
