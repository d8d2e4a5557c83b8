"""EvenBatches: every rank runs the same number of batches per epoch.

DDP pairs the gradient all-reduce of step *i* on every rank.  If one rank's
loader yields fewer batches (rank-local filtering, per-rank shards of different
sizes, an IterableDataset, ``continue`` on a bad batch), that rank leaves the
loop while the others wait for it: a hang at the epoch end, or -- with gloo --
gradients silently averaged across different steps (DDP101).
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Iterable, Iterator

import torch.distributed as dist

from ddp_doctor.fixes import _dist

__all__ = ["EvenBatches"]

_NO_BATCH = object()


def _length_is_truthful(loader) -> bool:
    """True when ``len(loader)`` is exact (map-style DataLoader, list, ...), False when absent or an estimate."""
    try:
        len(loader)
    except TypeError:
        return False
    try:
        from torch.utils.data import DataLoader, IterableDataset
    except Exception:  # pragma: no cover
        return True
    if isinstance(loader, DataLoader) and isinstance(loader.dataset, IterableDataset):
        return False  # an IterableDataset's __len__ is a hint: DataLoader may yield more or fewer
    return True


class EvenBatches:
    """Wrap a loader (or any iterable) so every rank yields the same number of batches.

    Parameters
    ----------
    loader:
        A ``DataLoader`` (map-style or iterable dataset) or any re-iterable object.
    mode:
        ``"min"`` (default): every rank stops after the *shortest* rank's count;
        longer ranks drop their surplus batches for this epoch.
        ``"max"``: every rank runs the *longest* rank's count; shorter ranks
        wrap around to the start of their own data (as ``DistributedSampler``
        pads indices).  Trade-off: ``min`` never trains on a sample twice but
        drops up to (max-min) batches per rank per epoch (with a shuffling
        sampler a different surplus each epoch); ``max`` uses every sample but
        counts some samples of the short ranks twice, and needs every rank to
        have at least one batch.  Prefer ``min`` unless the imbalance is large.
    keep:
        Optional predicate ``keep(batch) -> bool``: rank-local filtering done
        right.  Batches for which it is false are skipped on that rank only
        (e.g. ``keep=lambda b: b is not None`` for a collate_fn that returns
        None), and the counts are still agreed.
    sync:
        ``"epoch"``: agree on the count once per epoch (one all-reduce of two
        integers) from ``len(loader)``.  Only correct when ``len`` is exact.
        ``"step"``: agree before every batch whether every rank (``min``) or
        any rank (``max``) still has one: one all-reduce of three integers per
        batch (tens of microseconds on gloo), correct for any iterable,
        including unknown or lying lengths and rank-local filtering.
        ``"auto"`` (default): ``"epoch"`` when the length is exact and there is
        no ``keep``, else ``"step"``.  On NCCL each per-step agreement reads a
        flag back from the GPU; pass ``group=dist.new_group(backend="gloo")``
        (created on every rank) to keep it on the CPU.
    group:
        Process group (default: the world).

    Every ``iter()`` is a collective: iterate on every rank.  Attributes not
    defined here (``sampler``, ``dataset``, ``batch_size``...) are forwarded to
    the wrapped loader; ``last_epoch`` holds the local/agreed counts of the
    last epoch.

    Example::

        loader = DataLoader(ds, batch_size=32, sampler=DistributedSampler(ds))
        for epoch in range(epochs):
            loader.sampler.set_epoch(epoch)
            for x, y in EvenBatches(loader, keep=lambda b: b[0].numel() > 0):
                loss = ddp_model(x).sum(); loss.backward(); opt.step()
    """

    def __init__(self, loader: Iterable, mode: str = "min", *, keep: Callable[[Any], bool] | None = None,
                 sync: str = "auto", group=None):
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', not {mode!r}")
        if sync not in ("auto", "epoch", "step"):
            raise ValueError(f"sync must be 'auto', 'epoch' or 'step', not {sync!r}")
        if sync == "epoch" and (keep is not None or not _length_is_truthful(loader)):
            raise ValueError("sync='epoch' needs an exact len(loader) and no keep= filter; use sync='step'")
        self.loader = loader
        self.mode = mode
        self.keep = keep
        self.group = group
        if sync == "auto":
            sync = "epoch" if keep is None and _length_is_truthful(loader) else "step"
        self.sync = sync
        self.last_epoch: dict[str, Any] = {}

    def __getattr__(self, name):
        if name == "loader":  # not yet set (during unpickling)
            raise AttributeError(name)
        return getattr(self.loader, name)

    # -- local iteration with the keep= filter -------------------------------------------
    def _local(self) -> Iterator:
        for batch in self.loader:
            if self.keep is None or self.keep(batch):
                yield batch

    def _wrap_source(self) -> Iterator:
        """Batches for padding in mode='max': the rank's data again from its start."""
        while True:
            produced = False
            for batch in self._local():
                produced = True
                yield batch
            if not produced:
                return

    def __iter__(self) -> Iterator:
        if not _dist.active(self.group):
            n = 0
            for batch in self._local():
                n += 1
                yield batch
            self.last_epoch = {"local": n, "yielded": n, "padded": 0, "dropped": 0}
            return
        if self.sync == "epoch":
            yield from self._iter_epoch()
        else:
            yield from self._iter_step()

    def _iter_epoch(self) -> Iterator:
        n_local = len(self.loader)
        t = _dist.int_tensor([n_local, -n_local], self.group)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
        n_max, n_min = int(t[0].item()), -int(t[1].item())
        target = n_min if self.mode == "min" else n_max
        if self.mode == "max" and n_min == 0:
            raise RuntimeError("EvenBatches(mode='max'): a rank has no batch to pad with (len(loader) == 0 on some rank)")
        self.last_epoch = {"local": n_local, "min": n_min, "max": n_max, "yielded": target,
                           "padded": max(0, target - n_local), "dropped": max(0, n_local - target)}
        source = self._local() if target <= n_local else itertools.chain(self._local(), self._wrap_source())
        count = 0
        for batch in source:
            if count >= target:
                break
            count += 1
            yield batch
        if count < target:
            raise RuntimeError(
                f"EvenBatches: rank {_dist.rank(self.group)} ran out after {count} of the {target} batches agreed "
                f"from len(loader)={n_local}: the loader's length is not exact; use sync='step'")

    def _iter_step(self) -> Iterator:
        it = self._local()
        pad: Iterator | None = None
        local = padded = 0
        exhausted = False
        while True:
            batch = _NO_BATCH
            if not exhausted:
                batch = next(it, _NO_BATCH)
                exhausted = batch is _NO_BATCH
            has = batch is not _NO_BATCH
            # a rank with no batch at all cannot pad: tell everyone, so all ranks raise together
            error = int(self.mode == "max" and not has and local == 0)
            # [this rank has no batch, this rank has one, error] -- MAX over ranks
            t = _dist.int_tensor([int(not has), int(has), error], self.group)
            dist.all_reduce(t, op=dist.ReduceOp.MAX, group=self.group)
            any_missing, any_has, any_error = (int(v) for v in t.tolist())
            if self.mode == "max" and any_error and any_has:
                raise RuntimeError("EvenBatches(mode='max'): a rank has no batch at all to pad with "
                                   f"(this is rank {_dist.rank(self.group)}, local batches {local}); use mode='min'")
            if (any_missing if self.mode == "min" else not any_has):
                # in mode='min' a rank that still had a batch drops it and whatever follows
                # (not drained: that would load data for nothing)
                self.last_epoch = {"yielded": local + padded, "padded": padded,
                                   "dropped_at_least": int(has) if self.mode == "min" else 0}
                return
            if has:
                local += 1
            else:  # mode == "max": another rank still has data; pad with our own data from its start
                if pad is None:
                    pad = self._wrap_source()
                batch = next(pad)
                padded += 1
            yield batch
