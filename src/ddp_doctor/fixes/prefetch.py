"""CUDAPrefetcher: copy the next batch to the GPU on a side stream while the current one computes."""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

__all__ = ["CUDAPrefetcher", "move_to"]


def _map(batch: Any, fn) -> Any:
    if isinstance(batch, torch.Tensor):
        return fn(batch)
    if isinstance(batch, dict):
        out = {k: _map(v, fn) for k, v in batch.items()}
        try:
            return type(batch)(out) if type(batch) is not dict else out
        except TypeError:
            return out
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(_map(v, fn) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(_map(v, fn) for v in batch)
    return batch


def _tensors(batch: Any) -> Iterator[torch.Tensor]:
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors(v)


def move_to(batch: Any, device, non_blocking: bool = False) -> Any:
    """``batch`` (tensors nested in lists/tuples/dicts/namedtuples) moved to ``device``."""
    return _map(batch, lambda t: t.to(device, non_blocking=non_blocking))


class _Cuda:
    """The CUDA calls the prefetcher makes, in one place (tests substitute an honest fake)."""

    def stream(self, device):
        return torch.cuda.Stream(device=device)

    def use_stream(self, stream):
        return torch.cuda.stream(stream)

    def current_stream(self, device):
        return torch.cuda.current_stream(device)

    def pin(self, t: torch.Tensor) -> torch.Tensor:
        return t if t.is_pinned() else t.pin_memory()

    def copy(self, t: torch.Tensor, device) -> torch.Tensor:
        return t.to(device, non_blocking=True)

    def record(self, t: torch.Tensor, stream) -> None:
        t.record_stream(stream)


class CUDAPrefetcher:
    """Iterate ``loader`` with the next batch already on ``device``.

    On CUDA, batch *i+1* is copied host-to-device on a side stream while the
    default stream computes on batch *i*:

    * the copy is ``non_blocking`` from **pinned** memory (pass
      ``pin_memory=True`` to the DataLoader -- pinning here, in the main
      process, costs a synchronous host copy; unpinned tensors are pinned here
      only when ``pin=True``);
    * before a batch is handed out, the compute stream ``wait_stream``\\ s the
      copy stream (no use of half-copied data);
    * every handed-out tensor is ``record_stream``\\ ed on the compute stream
      (its memory, allocated on the side stream, is not reused by the caching
      allocator while compute still reads it).

    Seed 004's version forgot the last two: it is fast and occasionally wrong.

    On CPU (or any non-CUDA device) it degrades to a pass-through that moves
    each batch with ``.to(device)`` -- the same code runs everywhere.

    Example::

        loader = DataLoader(ds, batch_size=64, num_workers=4, pin_memory=True, sampler=sampler)
        for x, y in CUDAPrefetcher(loader, local_device()):
            loss = ddp_model(x).loss(y) ...

    Attributes (``sampler``, ``dataset``...) are forwarded to the loader, and
    ``len()`` is the loader's.
    """

    _cuda = _Cuda()

    def __init__(self, loader: Iterable, device=None, pin: bool = True):
        self.loader = loader
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        self.device = torch.device(device)
        self.pin = pin

    def __len__(self) -> int:
        return len(self.loader)  # type: ignore[arg-type]

    def __getattr__(self, name):
        if name == "loader":
            raise AttributeError(name)
        return getattr(self.loader, name)

    def __iter__(self) -> Iterator:
        if self.device.type != "cuda":
            for batch in self.loader:
                yield move_to(batch, self.device)
            return
        yield from self._iter_cuda()

    def _iter_cuda(self) -> Iterator:
        cuda = self._cuda
        side = cuda.stream(self.device)
        it = iter(self.loader)
        done = object()

        def preload():
            batch = next(it, done)
            if batch is done:
                return done
            with cuda.use_stream(side):
                return _map(batch, lambda t: cuda.copy(cuda.pin(t) if self.pin else t, self.device))

        nxt = preload()
        while nxt is not done:
            compute = cuda.current_stream(self.device)
            compute.wait_stream(side)
            batch = nxt
            for t in _tensors(batch):  # every tensor of the batch was copied on the side stream
                cuda.record(t, compute)
            nxt = preload()  # issue the next copy before the caller computes on `batch`
            yield batch
