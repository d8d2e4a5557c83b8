"""Rules found by red-teaming unseen jobs: a rank that left a loop first because it skipped steps is blamed
at the loop's `continue` (not the loop header); a DDP forward no backward followed is blamed at the exit
after it; a collective of one's own inside a Join another rank joined is DDP201 at that collective."""
from __future__ import annotations

import textwrap

from ddp_doctor.diagnose import joined
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.diagnose.wording import decided
from ddp_doctor.evidence import (Collective, RaisedError, ExitStatus, JobEvidence, LoaderState, RankState, Site,
                                 SkippedSync)
from ddp_doctor.findings import Location


def _script(tmp_path, text: str, name: str = "train.py") -> str:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text).lstrip())
    return str(p)


def _line(path: str, marker: str) -> int:
    return next(i for i, ln in enumerate(open(path).read().splitlines(), 1) if marker in ln)


LOOP = """
    def main(model, loader, opt, dist):
        for batch in loader:
            loss = step(model, batch)
            if loss is None:
                continue
            loss.backward()
            opt.step()
        dist.all_reduce(seen)
"""


def _with_skips(st: RankState, skips: int) -> RankState:
    return st.with_(loaders=(LoaderState(skips_by_epoch=(skips,)),), train_loader=0)


def test_a_rank_that_skipped_steps_left_the_loop_at_its_continue(tmp_path):
    path = _script(tmp_path, LOOP)
    left = [Site(path, _line(path, "dist.all_reduce"), "main")]
    stayed = [Site(path, _line(path, "loss.backward"), "main")]
    ranks = {0: _with_skips(RankState(rank=0, stack=tuple(left)), 1),
             1: _with_skips(RankState(rank=1, stack=tuple(stayed)), 0)}
    f = Draft("DDP201", "Rank 0 called all_reduce ...", "", location=Location(path, left[0].line, "main"),
                ranks=[0])
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "continue")
    assert out.evidence["decision"]["kind"] == "continue"


def test_equal_skips_and_no_counts_claim_nothing_about_the_loop(tmp_path):
    """No recorded fact says the loop ran a different number of times: the finding stays where it showed."""
    path = _script(tmp_path, LOOP)
    ranks = {0: _with_skips(RankState(rank=0, stack=(Site(path, _line(path, "dist.all_reduce"), "main"),)), 0),
             1: _with_skips(RankState(rank=1, stack=(Site(path, _line(path, "loss.backward"), "main"),)), 0)}
    f = Draft("DDP201", "m", "", location=Location(path, _line(path, "dist.all_reduce"), "main"), ranks=[0])
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "dist.all_reduce")
    assert "different number" not in out.message and "decision" not in out.evidence


LOADER_LOOP = """
    def main(model, data, opt, dist):
        loader = DataLoader(data, batch_size=4)
        for batch in loader:
            model(batch).sum().backward()
            opt.step()
        dist.all_reduce(seen)
"""


def _loader(path: str, n: int, drawn: int) -> LoaderState:
    return LoaderState(site=Site(path, _line(path, "DataLoader("), "main"), len=n, batches_by_epoch=(drawn,))


def test_a_loop_over_loaders_of_different_lengths_says_the_lengths(tmp_path):
    path = _script(tmp_path, LOADER_LOOP)
    back = Collective("world", 9, "ddp.backward(allreduce_grads)", (), (), Site(path, _line(path, "backward"), "main"))
    ranks = {0: RankState(rank=0, stack=(Site(path, _line(path, "dist.all_reduce"), "main"),),
                          loaders=(_loader(path, 3, 3),), train_loader=0),
             1: RankState(rank=1, stack=(Site(path, _line(path, "backward"), "main"),), in_collective=back,
                          loaders=(_loader(path, 4, 4),), train_loader=0)}
    f = Draft("DDP201", "m", "", location=Location(path, _line(path, "dist.all_reduce"), "main"), ranks=[0])
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "for batch in loader")
    assert "len() is 3 on rank 0 and 4 on rank 1" in out.message
    # the rank that left a training loop early is the culprit of uneven steps: DDP101, not DDP201
    assert out.code == "DDP101" and out.ranks == [0]


def test_a_rank_above_the_loop_never_left_it(tmp_path):
    """"rank 0 left the loop" only when rank 0's line is past the loop's end."""
    path = _script(tmp_path, """
        def main(model, loader, rank, dist):
            if rank == 0:
                dist.barrier()
            for batch in loader:
                model(batch).sum().backward()
    """)
    ranks = {0: RankState(rank=0, stack=(Site(path, _line(path, "dist.barrier"), "main"),)),
             1: RankState(rank=1, stack=(Site(path, _line(path, "backward"), "main"),))}
    f = Draft("DDP201", "m", "", location=Location(path, _line(path, "dist.barrier"), "main"), ranks=[0])
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "if rank == 0")
    assert "left the loop" not in out.message


def test_a_forward_with_no_backward_is_blamed_at_the_exit_after_it(tmp_path):
    path = _script(tmp_path, """
        class Loop:
            def step(self, batch):
                if batch is None:
                    return 0
                loss = self.model(batch)
                if math.isnan(loss.item()):
                    return None
                loss.backward()
    """)
    fwd = Site(path, _line(path, "self.model(batch)"), "step")
    ranks = {0: RankState(rank=0, skipped_syncs=(SkippedSync(3, fwd, 0),), syncs_skipped=1),
             1: RankState(rank=1, stack=(Site(path, _line(path, "loss.backward"), "step"),))}
    f = Draft("DDP101", "m", "", location=Location(path, _line(path, "loss.backward"), "step"), ranks=[0],
              after_forward=True)
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "return None")  # not the `return 0` before the forward


def _join_ev(path: str, direct: bool = True) -> JobEvidence:
    jl = _line(path, "with Join")
    join_exit = (Site(path, jl, "main"), Site("/x/torch/distributed/algorithms/join.py", 274, "__exit__"))
    line = _line(path, "dist.all_reduce" if direct else "model(x)")
    call = Collective("world", 84, "all_reduce", ("scalar",), ("float32",), Site(path, line, "main"), join=True)
    return JobEvidence(world_size=2, ranks={
        0: RankState(rank=0, stack=join_exit, exc=RaisedError("RuntimeError", "reset", "builtins", Site(path, jl, "main"))),
        1: RankState(rank=1, last_collective=call, exit=ExitStatus(exit_code=-6, signal="SIGABRT"))})


JOIN = """
    import torch.distributed as dist
    from torch.distributed.algorithms.join import Join

    def main(model, batches):
        with Join([model]):
            for x in batches:
                model(x).sum().backward()
                dist.all_reduce(x)
"""


def test_own_collective_inside_a_joined_join_is_ddp201_there(tmp_path):
    path = _script(tmp_path, JOIN)
    (f,) = joined.diagnose_join_own_collective(_join_ev(path))
    assert f.code == "DDP201" and f.ranks == [1] and f.location.line == _line(path, "dist.all_reduce")


def test_a_torch_call_inside_join_is_not_the_users_collective(tmp_path):
    path = _script(tmp_path, JOIN)  # the join notification DDP's forward issues: the line calls no collective
    assert joined.diagnose_join_own_collective(_join_ev(path, direct=False)) == []


def test_rooted_collectives_agree_on_their_root():
    from ddp_doctor.evidence.agreement import must_agree
    from ddp_doctor.probe.describe import describe
    import torch

    t = torch.zeros(1)
    a, b = describe("broadcast", (t, 0), {}), describe("broadcast", (t,), {"src": 0})
    assert a == b and "root=0" in a[0]
    assert must_agree("broadcast", "world", *describe("broadcast", (t,), {"src": 1})) != \
        must_agree("broadcast", "world", *a)
    o0 = describe("broadcast_object_list", ([1, 2],), {"src": 0})
    o1 = describe("broadcast_object_list", ([1],), {"src": 0})
    assert must_agree("broadcast_object_list", "world", *o0) == must_agree("broadcast_object_list", "world", *o1)
    assert must_agree("broadcast_object_list", "world", *describe("broadcast_object_list", ([1],), {"src": 1})) != \
        must_agree("broadcast_object_list", "world", *o0)
    # gather: the list is the root's only, the root is everyone's
    g0 = describe("gather", (t, [t, t], 0), {})
    g1 = describe("gather", (t,), {"dst": 0})
    assert must_agree("gather", "world", *g0) == must_agree("gather", "world", *g1)
    # a root left to torch's default (global rank 0) is the same root as one named 0: no false mismatch
    for op, args in (("gather", (t,)), ("scatter", (t,)), ("gather_object", (1,)),
                     ("broadcast_object_list", ([1],)), ("scatter_object_list", ([None],))):
        key = "dst" if "gather" in op else "src"
        assert must_agree(op, "world", *describe(op, args, {})) == must_agree(op, "world", *describe(op, args,
                                                                                                    {key: 0})), op


def test_a_flag_set_only_on_rank_zero_says_so(tmp_path):
    from ddp_doctor.diagnose.source import function_at, parse_file, set_on_some_ranks
    import ast

    path = _script(tmp_path, """
        def main(rank, epochs):
            should_stop = False
            for epoch in range(epochs):
                if rank == 0:
                    should_stop = epoch > 3
                if should_stop:
                    break
    """)
    tree, _ = parse_file(path)
    fn = function_at(tree, "main", 3)
    test = next(n.test for n in ast.walk(fn) if isinstance(n, ast.If) and "should_stop" in ast.unparse(n.test))
    why = set_on_some_ranks(path, fn, test)
    assert why and "`should_stop` is set only under `if rank == 0:`" in why


def test_a_group_root_is_read_as_its_global_rank(monkeypatch):
    import torch
    import torch.distributed as dist
    from ddp_doctor.probe.describe import describe

    monkeypatch.setattr(dist, "get_global_rank", lambda g, r: {"g23": 2}[g] + r)
    t = torch.zeros(1)
    by_group = describe("reduce", (t, None, dist.ReduceOp.SUM, "g23"), {"group_dst": 1})
    assert "root=3" in by_group[0]
    assert by_group == describe("reduce", (t,), {"dst": 3, "group": "g23"})


def test_unused_parameters_are_blamed_at_the_forward_branch_that_skips_their_module(tmp_path):
    from ddp_doctor.diagnose.unused import unused_branch
    from ddp_doctor.evidence import DdpParam
    model_file = _script(tmp_path, """
        class Heads(nn.Module):
            def forward(self, x, aux=None):
                h = self.body(x)
                if aux is not None:
                    return self.main(h), self.extra.proj(h)
                return self.main(h), None
    """, "heads.py")
    train = _script(tmp_path, """
        def main():
            net = Heads().to(device)
            model = DDP(net)
    """)
    ddp = Site(train, _line(train, "DDP(net)"), "main")
    ranks = {0: RankState(rank=0, stack=(Site(model_file, 3, "forward"),)), 1: RankState(rank=1)}
    d = unused_branch(ddp, [DdpParam(4, "extra.proj.weight"), DdpParam(5, "extra.proj.bias")], [1], ranks)
    assert d is not None and (d.site.path, d.site.line) == (model_file, _line(model_file, "if aux is not None"))
    assert "rank 1" in d.text() and "self.extra" in d.text()
    # parameters of two modules, or a model class that cannot be read: no decision is claimed
    assert unused_branch(ddp, [DdpParam(0, "body.weight"), DdpParam(4, "extra.proj.weight")], [1], ranks) is None


def test_a_rank_without_a_stack_stands_where_it_waits_and_left_the_loop_at_its_break(tmp_path):
    """gloo aborted rank 0 before its stack was taken: the collective it waited in is where it stood."""
    path = _script(tmp_path, """
        def main(model, opt, dist, rank):
            for step in range(20):
                loss = model(step)
                loss.backward()
                if stop_early(loss):
                    break
            dist.all_reduce(done)
    """)
    wait = Collective("world", 7, "all_reduce", ("1",), ("float32",), Site(path, _line(path, "dist.all_reduce"), "main"))
    back = Collective("world", 7, "ddp.backward(allreduce_grads)", (), (), Site(path, _line(path, "backward"), "main"))
    ranks = {0: RankState(rank=0, in_collective=wait),
             1: RankState(rank=1, stack=(Site(path, _line(path, "backward"), "main"),), in_collective=back)}
    f = Draft("DDP201", "m", "", location=Location(path, wait.site.line, "main"), ranks=[0])
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "break")
    assert out.code == "DDP101" and out.ranks == [0]


def test_a_rank_that_finished_with_fewer_steps_left_the_loop_through_its_skip(tmp_path):
    """nanoGPT's `while True` with a counter: rank 0's skip moved the counter without a step, it finished
    (no stack), rank 1 is in the backward of a step rank 0 never ran: the `continue`, not the `break`."""
    path = _script(tmp_path, """
        def main(model, opt, batches):
            it = 0
            while True:
                x = batches(it)
                if bad(x):
                    it += 1
                    continue
                model(x).sum().backward()
                opt.step()
                it += 1
                if it >= 14:
                    break
    """)
    back = Collective("world", 14, "ddp.backward(allreduce_grads)", (), (), Site(path, _line(path, "backward"), "main"))
    ranks = {0: RankState(rank=0, step=13, done=True),
             1: RankState(rank=1, step=13, stack=(Site(path, _line(path, "backward"), "main"),), in_collective=back)}
    f = Draft("DDP101", "m", "", location=Location(path, _line(path, "break"), "main"), ranks=[0])
    out = decided([f], ranks)[0]
    assert out.location.line == _line(path, "continue")
    assert "left the loop after 13 optimizer steps" in out.message and "in step 14" in out.message
