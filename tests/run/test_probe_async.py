"""Collectives that return before their work completes (``async_op=True``; NCCL's stream semantics).

The probe keeps such a collective issued until ``work.is_completed()``: a rank blocked later in
``work.wait()`` (or, on NCCL, in the CUDA sync that waits for it) is still shown waiting in that
collective, not as a rank stalled outside collectives."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_doctor.probe import hooks
from ddp_doctor.probe.publisher import snapshot
from ddp_doctor.probe.recorder import Recorder

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).parent / "scripts" / "async_collective.py"


class FakeWork:
    """A c10d Work as the probe sees it: ``is_completed()`` and ``wait()``."""

    def __init__(self) -> None:
        self.completed = False
        self.waited = False

    def is_completed(self) -> bool:
        return self.completed

    def wait(self) -> bool:
        self.waited = True
        return True


class FakeCudaTensor:
    is_cuda = True
    shape = (4,)
    dtype = "float32"


@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(hooks, "REC", r)
    return r


def test_pending_until_work_completes(rec):
    work = FakeWork()

    def all_reduce(tensor, op=None, group=None, async_op=False):
        assert async_op
        return work

    wrapped = hooks._wrap_collective(all_reduce, "all_reduce")
    assert wrapped(object(), async_op=True) is work
    assert rec.cur is None and rec.progress == 0
    st = snapshot(rec)
    assert st.in_collective is not None and st.in_collective.op == "all_reduce" and st.in_collective.seq == 0
    assert st.in_collective.site.function == "test_pending_until_work_completes"
    work.completed = True
    st = snapshot(rec)
    assert st.in_collective is None
    assert st.last_collective.op == "all_reduce" and rec.progress == 1 and not rec.pending


def test_oldest_incomplete_is_shown_and_completed_ones_leave(rec):
    works = [FakeWork(), FakeWork(), FakeWork()]
    it = iter(works)
    wrapped = hooks._wrap_collective(lambda t, group=None, async_op=False: next(it), "broadcast")
    for _ in works:
        wrapped(object(), async_op=True)
    works[0].completed = works[2].completed = True
    assert rec.poll_pending()[1] == 1  # the seq of the one still running
    assert rec.progress == 2 and len(rec.pending) == 1


def test_rank_outside_group_returns_none(rec):
    wrapped = hooks._wrap_collective(lambda t, group=None, async_op=False: None, "all_reduce")
    assert wrapped(object(), async_op=True) is None
    assert not rec.pending and rec.cur is None and rec.progress == 1


def test_nccl_sync_call_is_issued_async_and_waited(rec, monkeypatch):
    """NCCL (faked: a CUDA tensor on a group whose backend is nccl): the user's synchronous call is made
    with async_op=True and waited as torch would, and the probe keeps the work until it completes."""
    import torch.distributed as dist

    monkeypatch.setattr(hooks, "_stream_backends", {})
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    work = FakeWork()
    seen = {}

    def all_reduce(tensor, op=None, group=None, async_op=False):
        seen["async_op"] = async_op
        return work if async_op else None

    wrapped = hooks._wrap_collective(all_reduce, "all_reduce")
    assert wrapped(FakeCudaTensor()) is None  # what torch returns for a synchronous call
    assert seen["async_op"] is True and work.waited
    assert snapshot(rec).in_collective.op == "all_reduce"  # queued on the stream, not completed yet
    work.completed = True
    assert snapshot(rec).in_collective is None and rec.progress == 1


def test_gloo_and_cpu_sync_calls_unchanged(rec, monkeypatch):
    import torch
    import torch.distributed as dist

    monkeypatch.setattr(hooks, "_stream_backends", {})
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "gloo")
    seen = {}

    def all_reduce(tensor, op=None, group=None, async_op=False):
        seen["async_op"] = async_op

    hooks._wrap_collective(all_reduce, "all_reduce")(FakeCudaTensor())
    hooks._wrap_collective(all_reduce, "all_reduce")(torch.ones(1))
    assert seen["async_op"] is False and rec.progress == 2 and not rec.pending


@pytest.mark.scenario
def test_real_gloo_async_op(tmp_path):
    """A real 2-rank gloo job under ddp-doctor run: while rank 1 is late, rank 0's async all_reduce is
    shown issued at its line; after ``wait()`` it is the last completed collective."""
    out = tmp_path / "probe_view.json"
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src") + os.pathsep + os.environ.get("PYTHONPATH", ""))
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "run", "--no-lint", "--report", str(tmp_path / "r.json"),
                        "--nproc-per-node", "2", str(SCRIPT), str(out)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    view = json.loads(out.read_text())
    line = next(i for i, ln in enumerate(SCRIPT.read_text().splitlines(), 1) if "the issuing line" in ln)
    assert view["completed_early"] is False
    assert view["issued"]["op"] == "all_reduce" and view["issued"]["site"]["line"] == line
    assert view["issued"]["waiting_s"] >= 0
    assert view["after_wait"] is None
    assert view["last"]["op"] == "all_reduce" and view["last"]["seq"] == view["issued"]["seq"]
    assert view["sum"] == [2.0] * 4
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "ok"
