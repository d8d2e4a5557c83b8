"""CUDAPrefetcher: the CUDA protocol checked against an honest fake of the CUDA calls.

Real-GPU tests run where CUDA exists (skipped visibly here; benchmarks/gpu_check.sh runs them).
"""
import collections
import contextlib

import pytest
import torch

from ddp_doctor.fixes import CUDAPrefetcher, move_to


class FakeStream:
    def __init__(self, name, log):
        self.name, self.log = name, log

    def wait_stream(self, other):
        self.log.append(("wait", self.name, other.name))

    def __repr__(self):
        return self.name


class FakeCuda:
    """Same calls as prefetch._Cuda; copies are clones, and every call is logged with the active stream."""

    def __init__(self):
        self.log = []
        self.active = "default"
        self.default = FakeStream("default", self.log)
        self.pinned = set()
        self.copies = {}

    def stream(self, device):
        assert device.type == "cuda"
        return FakeStream("side", self.log)

    @contextlib.contextmanager
    def use_stream(self, stream):
        prev, self.active = self.active, stream.name
        try:
            yield
        finally:
            self.active = prev

    def current_stream(self, device):
        return self.default

    def pin(self, t):
        out = t.clone()
        self.pinned.add(id(out))
        self.log.append(("pin",))
        return out

    def copy(self, t, device):
        out = t.clone()
        self.log.append(("copy", self.active, id(t) in self.pinned, id(out)))
        return out

    def record(self, t, stream):
        self.log.append(("record", stream.name, id(t)))


def _loader():
    return [(torch.full((2, 3), float(i)), {"y": torch.tensor([i]), "name": f"b{i}"}) for i in range(4)]


def test_cuda_protocol_with_fake(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(CUDAPrefetcher, "_cuda", fake)
    got = []
    for x, d in CUDAPrefetcher(_loader(), device="cuda:0"):
        fake.log.append(("consume", int(x[0, 0])))
        got.append((x, d))
    # values and structure kept (non-tensors passed through)
    assert [int(x[0, 0]) for x, _ in got] == [0, 1, 2, 3] and got[2][1]["name"] == "b2"
    copies = [e for e in fake.log if e[0] == "copy"]
    assert len(copies) == 8
    assert all(e[1] == "side" for e in copies), "every H2D copy is issued on the side stream"
    assert all(e[2] for e in copies), "every copy is from pinned memory"
    log = fake.log
    for k in range(4):
        consume = log.index(("consume", k))
        before = log[:consume]
        # the compute stream waited for the copy stream before batch k was handed out
        waits = [i for i, e in enumerate(before) if e == ("wait", "default", "side")]
        assert len(waits) == k + 1
        # every tensor of batch k was record_stream'ed on the compute stream
        ids = {id(got[k][0]), id(got[k][1]["y"])}
        recorded = {e[2] for e in before if e[0] == "record" and e[1] == "default"}
        assert ids <= recorded
        if k < 3:  # overlap: batch k+1's copy was issued before the caller computed on batch k
            assert sum(1 for e in before if e[0] == "copy") == 2 * (k + 2)


def test_no_pin_when_disabled(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(CUDAPrefetcher, "_cuda", fake)
    list(CUDAPrefetcher(_loader(), device=torch.device("cuda", 1), pin=False))
    assert not any(e[0] == "pin" for e in fake.log)


def test_cpu_pass_through(monkeypatch):
    fake = FakeCuda()
    monkeypatch.setattr(CUDAPrefetcher, "_cuda", fake)
    loader = torch.utils.data.DataLoader(torch.arange(10.0), batch_size=4)
    pf = CUDAPrefetcher(loader, device="cpu")
    assert len(pf) == 3 and pf.batch_size == 4
    assert [b.tolist() for b in pf] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert fake.log == []  # no CUDA call on CPU


def test_move_to_nested():
    P = collections.namedtuple("P", "a b")
    out = move_to({"p": P(torch.ones(1), [torch.zeros(1), 3])}, "cpu")
    assert isinstance(out["p"], P) and out["p"].b[1] == 3


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the real-GPU prefetcher test needs one")
def test_real_cuda_prefetch():
    loader = torch.utils.data.DataLoader(torch.arange(64.0).reshape(16, 4), batch_size=4, pin_memory=True)
    out = [b.clone() for b in CUDAPrefetcher(loader, torch.device("cuda", 0))]
    assert all(b.is_cuda for b in out)
    assert torch.equal(torch.cat(out).cpu(), torch.arange(64.0).reshape(16, 4))


class _Filled(torch.utils.data.Dataset):
    """Batch i is a large tensor full of i: a batch read before its copy ended would hold other values."""

    def __len__(self):
        return 48

    def __getitem__(self, i):
        return torch.full((1 << 20,), float(i))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: the real-GPU prefetcher test needs one")
def test_real_cuda_prefetch_under_load():
    """Copies on the side stream race with heavy work on the compute stream: every batch must still be whole
    when read (wait_stream) and not be overwritten while read (record_stream)."""
    dev = torch.device("cuda", 0)
    loader = torch.utils.data.DataLoader(_Filled(), batch_size=None, pin_memory=True)
    w = torch.randn(2048, 2048, device=dev)
    seen = []
    for i, batch in enumerate(CUDAPrefetcher(loader, dev)):
        for _ in range(4):  # keep the compute stream busy while the next copy is in flight
            w = (w @ w).clamp_(-1, 1)
        seen.append(torch.stack([batch.min(), batch.max()]))
        del batch  # its memory may be reused only once the compute stream is done with it
    got = torch.stack(seen).cpu()
    assert torch.equal(got, torch.arange(48, dtype=torch.float32).repeat_interleave(2).reshape(48, 2))
