"""What the probe records for torch's errors and for the process group, on real torch objects in this process
(a gloo group of one): DDP's parameter numbering, the names an unused-parameter error refers to, the default
group's size and its own collective count, dead DataLoader workers, the post before a collective's first call."""
from __future__ import annotations

import signal
import weakref

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ddp_doctor.probe import ddp_params, groups, hooks, workers
from ddp_doctor.probe.recorder import LoaderRec, Recorder


@pytest.fixture
def group(tmp_path):
    """A gloo process group of world size 1 in this process, destroyed after the test."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class Net(nn.Module):
    """Every case of DDP's numbering: a root parameter, a frozen and an ignored module, nesting, a module
    registered twice (its parameters are numbered once), and a branch that does not run (``aux``)."""

    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(1))
        self.frozen = nn.Linear(4, 4).requires_grad_(False)
        self.ignored = nn.Linear(4, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU())
        self.aux = nn.Linear(4, 2)
        self.head = nn.Linear(4, 2)
        self.tied = self.head

    def forward(self, x, with_aux=False):
        h = self.body(self.ignored(self.frozen(x)))
        return self.head(h) * self.scale + (self.aux(h) if with_aux else 0)


def _ddp():
    model = Net()
    DDP._set_params_and_buffers_to_ignore_for_model(model, ["ignored.weight", "ignored.bias"])
    return DDP(model)


def test_reducer_numbering_is_torchs_own(group):
    ddp = _ddp()
    names = ddp_params.reducer_names(ddp)
    # torch's own index -> name map (what TORCH_DISTRIBUTED_DEBUG=DETAIL prints from)
    torch_map = ddp._build_debug_param_to_name_mapping(ddp._build_params_for_reducer()[0])
    assert [n for n, _t in names] == [torch_map[i].lstrip(".") for i in range(len(torch_map))]
    assert names == (("scale", "Net"), ("body.0.weight", "Linear"), ("body.0.bias", "Linear"),
                     ("aux.weight", "Linear"), ("aux.bias", "Linear"), ("head.weight", "Linear"),
                     ("head.bias", "Linear"))


def test_a_real_unused_parameter_error_is_named(group):
    ddp = _ddp()
    rec = Recorder()
    rec.ddps.append(({"reducer_params": ddp_params.reducer_names(ddp)}, weakref.ref(ddp)))
    x = torch.randn(3, 4)
    with pytest.raises(RuntimeError) as raised:
        for _ in range(2):
            ddp(x).sum().backward()
    assert "Parameter indices which did not receive grad for rank 0: 3 4" in str(raised.value)
    ddp_params.name_unused(rec, raised.value)
    named = rec.ddps[0][0]["named"]
    assert [(p.index, p.name, p.module_type, p.module) for p in named] == [
        (3, "aux.weight", "Linear", "aux"), (4, "aux.bias", "Linear", "aux")]


def test_name_unused_ignores_other_errors():
    rec = Recorder()
    rec.ddps.append(({"reducer_params": (("w", "Linear"),)}, lambda: None))
    ddp_params.name_unused(rec, RuntimeError("Connection closed by peer"))
    assert "named" not in rec.ddps[0][0]


def test_group_size_site_and_collective_count(group, monkeypatch):
    rec = Recorder()
    groups.note_group(rec)
    assert rec.group[:2] == (1, 0) and rec.group[3] == "gloo" and rec.group_colls == 0
    dist.all_reduce(torch.ones(1))
    groups.note_group(rec)
    assert rec.group_colls == 1


def test_the_publishers_thread_does_not_hold_the_group_once_seen(group):
    import threading

    rec = Recorder()
    groups.note_group(rec)
    dist.all_reduce(torch.ones(1))
    t = threading.Thread(target=groups.note_group, args=(rec,))
    t.start()
    t.join()
    assert rec.group_colls == 0  # read again only from the rank's main thread (the final post)
    groups.note_group(rec)
    assert rec.group_colls == 1


def test_init_wrapper_records_the_callers_line(tmp_path, monkeypatch):
    from torch.distributed import distributed_c10d as c10d

    monkeypatch.setattr(c10d, "init_process_group", c10d.init_process_group)
    monkeypatch.setattr(dist, "init_process_group", dist.init_process_group)
    rec = Recorder()
    groups.patch_init(rec)
    assert dist.init_process_group is c10d.init_process_group
    try:
        dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "s"), 1), rank=0, world_size=1)  # here
        assert rec.group[0] == 1 and rec.group[2][0] == __file__
        assert "# here" in open(__file__).read().splitlines()[rec.group[2][1] - 1]
    finally:
        dist.destroy_process_group()


class _Proc:
    def __init__(self, pid, exitcode):
        self.pid, self.exitcode = pid, exitcode


def test_dead_workers_are_kept_when_torch_shuts_them_down(monkeypatch):
    """Killed workers (not the ones torch itself terminates at shutdown) land on the loader's record."""
    from torch.utils.data import dataloader as dl_mod

    class FakeIter:
        def _shutdown_workers(self):
            self._workers[2].exitcode = -signal.SIGTERM  # what torch does to a worker that would not exit

    monkeypatch.setattr(dl_mod, "_MultiProcessingDataLoaderIter", FakeIter)
    rec = Recorder()
    workers.patch_shutdown(rec)
    it = FakeIter()
    it._ddpd_rec = lr = LoaderRec(0, None, {}, None)
    it._workers = [_Proc(10, 0), _Proc(11, -signal.SIGKILL), _Proc(12, None)]
    it._shutdown_workers()
    assert [(w.pid, w.exit_code, w.signal) for w in lr.worker_exits] == [(11, -9, "SIGKILL")]


def test_dead_workers_of_a_held_iterator_are_found_when_the_rank_fails():
    rec = Recorder()
    lr = LoaderRec(0, None, {}, None)
    procs = [_Proc(20, None), _Proc(21, 3)]
    lr.workers = [weakref.ref(p) for p in procs]
    rec.loaders.append(lr)
    workers.note_dead_workers(rec, ValueError("unrelated"))
    assert [(w.pid, w.exit_code, w.signal) for w in lr.worker_exits] == [(21, 3, None)]


def test_first_call_at_a_line_is_posted_before_it_runs(monkeypatch):
    rec = Recorder()
    monkeypatch.setattr(hooks, "REC", rec)
    posted = []
    rec.flush = lambda: posted.append(rec.cur[2] if rec.cur else None)
    wrapped = hooks._wrap_collective(lambda t, group=None, async_op=False: None, "all_reduce")
    for _ in range(3):
        wrapped(torch.ones(2))  # one line: posted once, with the call in flight
    wrapped(torch.ones(2))  # another line
    assert posted == ["all_reduce", "all_reduce"]
