"""DDPDoctorCallback: a Lightning callback that turns uneven steps into a clear error instead of a hang.

Needs ``lightning`` (``pip install "ddp-doctor[lightning]"``); importing this
module without it raises ImportError with that hint.
"""
from __future__ import annotations

import datetime
import time

import torch

try:
    from lightning.pytorch.callbacks import Callback
except ImportError:  # pragma: no cover - depends on the environment
    try:
        from pytorch_lightning.callbacks import Callback  # type: ignore[no-redef]
    except ImportError as exc:
        raise ImportError("ddp_doctor.fixes.lightning needs Lightning: pip install 'lightning>=2.2'") from exc

__all__ = ["DDPDoctorCallback", "UnevenStepsError"]


class UnevenStepsError(RuntimeError):
    """Ranks ran (or were about to run) different numbers of training batches in an epoch (DDP101)."""


def _default_store():
    try:
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if dist.is_available() and dist.is_initialized():
            return c10d._get_default_store()
    except Exception:
        pass
    return None


def _leave_together(store, prefix: str, rank: int, world: int, timeout: float) -> None:
    """Rank 0 leaves the exchange only once every rank has read the counts.  Without torchrun's agent the store
    lives in rank 0's process (Lightning's own launcher): after the last epoch rank 0 ends, and the store with it,
    while another rank may still be reading (DistNetworkError on a healthy job).  The others' last call here is
    a ``set``, which waits for no answer."""
    store.set(f"{prefix}read/{rank}", "1")
    if rank != 0:
        return
    try:
        store.wait([f"{prefix}read/{r}" for r in range(world)], datetime.timedelta(seconds=timeout))
    except Exception:  # a rank gone after it wrote its count: the counts read are compared all the same
        pass


class DDPDoctorCallback(Callback):
    """Check every epoch that all ranks run the same number of training batches.

    * At epoch start, the ranks' ``trainer.num_training_batches`` are
      all-gathered (through the strategy, while all ranks are still in step):
      if the finite lengths differ, every rank raises :class:`UnevenStepsError`
      before the epoch that would hang.
    * At epoch end each rank publishes the number of batches it really ran in
      the job's rendezvous store (a side channel that cannot be mis-paired
      with DDP's gradient all-reduce) and waits for the others: if they ran a
      different number, every rank raises; if a rank is still training after
      ``timeout`` seconds (it has more batches: the others are waiting for it
      in an all-reduce, or it for them), the rank that finished raises
      :class:`UnevenStepsError` naming the ranks, instead of hanging silently.

    ``timeout=None``: 20x this rank's mean batch time, at least 10 s.

    Example::

        from ddp_doctor.fixes.lightning import DDPDoctorCallback
        trainer = L.Trainer(strategy="ddp", devices=4, callbacks=[DDPDoctorCallback()])

    Cure for what it finds: :class:`ddp_doctor.fixes.EvenBatches`.
    """

    def __init__(self, timeout: float | None = None, check_lengths: bool = True):
        self.timeout = timeout
        self.check_lengths = check_lengths
        self.steps_by_epoch: list[int] = []
        self._steps = 0
        self._t0 = 0.0
        self._fits = 0

    def on_fit_start(self, trainer, pl_module) -> None:
        self._fits += 1  # store keys per fit: a second trainer.fit() in the same job starts again at epoch 0

    # -- epoch start: compare the announced lengths -------------------------------------
    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._steps = 0
        self._t0 = time.monotonic()
        if not self.check_lengths or trainer.world_size <= 1:
            return
        n = trainer.num_training_batches
        n = -1 if n is None or n == float("inf") else int(n)
        gathered = trainer.strategy.all_gather(torch.tensor([n], device=pl_module.device))
        lengths = [int(v) for v in gathered.reshape(-1).tolist()]
        finite = {v for v in lengths if v >= 0}
        if len(finite) > 1:
            raise UnevenStepsError(
                f"DDP101 uneven-steps: epoch {trainer.current_epoch}: the ranks' training loaders have different "
                f"lengths {dict(enumerate(lengths))}; the ranks with more batches would wait forever in the gradient "
                "all-reduce of a batch the others never run. Use a DistributedSampler, or wrap the loader in "
                "ddp_doctor.fixes.EvenBatches.")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._steps += 1

    # -- epoch end: compare what really ran -----------------------------------------------
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.steps_by_epoch.append(self._steps)
        world = trainer.world_size
        if world <= 1:
            return
        epoch, rank = trainer.current_epoch, trainer.global_rank
        elapsed = time.monotonic() - self._t0
        timeout = self.timeout
        if timeout is None:
            timeout = max(10.0, 20.0 * elapsed / max(self._steps, 1))
        store = _default_store()
        if store is None:  # no side channel: compare through the strategy (all ranks are here if even)
            gathered = trainer.strategy.all_gather(torch.tensor([self._steps], device=pl_module.device))
            counts = {r: int(v) for r, v in enumerate(gathered.reshape(-1).tolist())}
        else:
            prefix = f"ddp_doctor/steps/{self._fits}/{epoch}/"
            store.set(prefix + str(rank), str(self._steps))
            keys = [prefix + str(r) for r in range(world)]
            try:
                store.wait(keys, datetime.timedelta(seconds=timeout))
            except Exception:
                missing = [r for r, k in enumerate(keys) if not store.check([k])]
                raise UnevenStepsError(
                    f"DDP101 uneven-steps: rank {rank} finished training epoch {epoch} after {self._steps} batches, "
                    f"but rank(s) {missing} had not finished it {timeout:.0f} s later: they have more batches, and "
                    "their next gradient all-reduce waits for ranks that already left the loop (the job would hang "
                    "here). Make every rank run the same number of batches: ddp_doctor.fixes.EvenBatches.") from None
            counts = {r: int(v) for r, v in enumerate(store.multi_get(keys))}
            _leave_together(store, prefix, rank, world, timeout)
        if len(set(counts.values())) > 1:
            raise UnevenStepsError(
                f"DDP101 uneven-steps: in epoch {epoch} the ranks ran different numbers of training batches {counts}: "
                "DDP averaged gradients of different steps together. Use ddp_doctor.fixes.EvenBatches.")
