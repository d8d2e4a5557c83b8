"""Blame the rank and line that diverged (issue 12), on synthetic evidence: a collective only some ranks
make while the others are in a library's own collective (Lightning's per-batch broadcast), subgroups
judged only against their own members, and process-group creation compared by its arguments."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from ddp_doctor import diagnose as _diagnose
from ddp_doctor.diagnose.live import find_desync
from ddp_doctor.evidence import GROUP_CREATION, Collective, JobEvidence, RankState, Site, Verdict
from ddp_doctor.probe import group_calls as groups, hooks
from ddp_doctor.probe.publisher import snapshot
from ddp_doctor.probe.recorder import Recorder

S = "/u/train.py"


def diagnose(ev, decision):
    return _diagnose.diagnose(JobEvidence.from_json(ev), Verdict.from_json(decision), {})


def site(line, fn="main"):
    return {"path": S, "line": line, "function": fn}


def call(op, line, fn="main", group="world", seq=12, **kw):
    return {"group": group, "seq": seq, "op": op, "site": site(line, fn), **kw}


def rank(r, calls_made, **kw):
    """A rank that made ``calls_made`` [(op, line, function)] (its sites_seen) and is in ``in_collective``."""
    st = {"rank": r, "progress": 10, "step": 4, "steps_by_epoch": [4], "forwards": 5, "sites": [],
          "site_counts": [], "loaders": [], "stack": [], "workers": [], "exit": None,
          "sites_seen": [[op, ["train.py", line, fn]] for op, line, fn in calls_made]}
    st.update(kw)
    return st


LIGHTNING_LOOP = [("barrier", 54, "main"), ("broadcast", 54, "main"), ("ddp.backward(allreduce_grads)", 54, "main")]


def test_object_collective_alone_vs_lightnings_own_broadcast_is_ddp201_at_the_hook():
    """Rank 0's broadcast_object_list (a LightningModule hook) pairs with rank 1's per-batch broadcast that
    Lightning issues inside `trainer.fit` (line 54, a line rank 0 issues collectives at too)."""
    calls = {0: call("broadcast_object_list", 28, "on_train_batch_end"), 1: call("broadcast", 54, shapes=["1"])}
    ev = {"ranks": {0: rank(0, LIGHTNING_LOOP + [("broadcast_object_list", 28, "on_train_batch_end")],
                            in_collective=calls[0]),
                    1: rank(1, LIGHTNING_LOOP, in_collective=call("ddp.backward(allreduce_grads)", 54, seq=13))}}
    verdict, fs = diagnose(ev, {"reason": "desync", "kind": "op", "group": "world", "seq": 12, "calls": calls})
    f = fs[0]
    assert f.code == "DDP201" and f.ranks == [0] and f.location.line == 28
    assert f.location.function == "on_train_batch_end"
    assert "rank 1: broadcast(1) at train.py:54 (main)" in f.message  # where the other rank was


def test_different_ops_at_lines_neither_rank_ran_before_stay_ddp203_naming_both():
    calls = {0: call("broadcast", 21, shapes=["1"]), 1: call("barrier", 23)}
    ev = {"ranks": {0: rank(0, [("broadcast", 21, "main")], in_collective=calls[0]),
                    1: rank(1, [("barrier", 23, "main")], in_collective=calls[1])}}
    _, fs = diagnose(ev, {"reason": "desync", "kind": "op", "group": "world", "seq": 12, "calls": calls})
    assert fs[0].code == "DDP203" and fs[0].ranks == [0, 1]
    assert "train.py:21" in fs[0].message and "train.py:23" in fs[0].message


def test_two_ops_from_one_dispatching_line_are_not_blamed_as_rank_conditional():
    """One helper line issuing different ops: the line is not rank-specific (the others issue at it too)."""
    calls = {0: call("all_reduce", 30, "sync"), 1: call("broadcast", 30, "sync")}
    seen = [("all_reduce", 30, "sync"), ("broadcast", 30, "sync")]
    ev = {"ranks": {0: rank(0, seen[:1], in_collective=calls[0]), 1: rank(1, seen[1:], in_collective=calls[1])}}
    _, fs = diagnose(ev, {"reason": "desync", "kind": "op", "group": "world", "seq": 12, "calls": calls})
    assert fs[0].code == "DDP203"


TRAIN = [("ddp.init(broadcast_params)", 36, "main"), ("ddp.backward(allreduce_grads)", 44, "main")]
HANG = {"reason": "hang", "stalled_s": 5.2, "limit_s": 5.0, "limit_how": "adaptive"}


def _node_ranks(leaders):
    """4 ranks in node groups pg:0,1 and pg:2,3; ``leaders`` wait in their node group's all_reduce (line
    48), the others in the world group's gradient all-reduce (line 44)."""
    out = {}
    for r in range(4):
        g = "pg:0,1" if r < 2 else "pg:2,3"
        if r in leaders:
            out[r] = rank(r, TRAIN + [("all_reduce", 48, "main")],
                          in_collective=call("all_reduce", 48, group=g, seq=0, shapes=["1"]))
        else:
            out[r] = rank(r, TRAIN, in_collective=call("ddp.backward(allreduce_grads)", 44, seq=5))
    return {"ranks": out}


def test_node_group_collective_of_the_leaders_is_ddp201_per_group_not_a_mix_of_groups():
    verdict, fs = diagnose(_node_ranks({0, 2}), HANG)
    f = fs[0]
    assert verdict == "hang"
    assert f.code == "DDP201" and f.ranks == [0, 2] and f.location.line == 48
    assert "pg:0,1 (ranks 0, 1) and pg:2,3 (ranks 2, 3)" in f.message
    assert "ranks disagree" not in f.message


def test_a_rank_conditional_collective_inside_one_subgroup_names_that_group():
    verdict, fs = diagnose(_node_ranks({2}), HANG)
    f = fs[0]
    assert f.code == "DDP201" and f.ranks == [2] and f.location.line == 48
    assert "on pg:2,3 (ranks 2, 3), a line the other ranks of that group have not reached" in f.message
    assert "rank 3 waits in ddp.backward(allreduce_grads)" in f.message


def _view(r, fps, sites_seen=()):
    st = RankState(rank=r, progress=5)
    return SimpleNamespace(rank=r, state=st, fps={(c.group, c.seq): c for c in fps}, sites_seen=set(sites_seen),
                           exit=None)


def test_fingerprints_are_compared_only_within_their_group():
    """Same sequence number, different groups, different shapes: nothing to compare."""
    views = {r: _view(r, [Collective("pg:0,1" if r < 2 else "pg:2,3", 0, "all_reduce", ("3" if r < 2 else "5",),
                                     ("float32",))]) for r in range(4)}
    assert find_desync(views, 4) is None


def test_positions_that_agreed_are_not_compared_again_but_a_late_rank_is():
    """Every poll compares only positions new since the last one (or reached by more ranks): a rank that
    arrives later at an agreed position with a different shape is still caught."""
    def ar(seq, shape):
        return Collective("world", seq, "all_reduce", (shape,), ("float32",), Site(S, 30, "main"))

    compared: dict = {}
    views = {0: _view(0, [ar(s, "4") for s in range(3)]), 1: _view(1, [ar(s, "4") for s in range(3)]),
             2: _view(2, [ar(0, "4")])}
    assert find_desync(views, 3, compared) is None
    assert compared[0] == compared[1] == {("world", s) for s in range(3)} and compared[2] == {("world", 0)}
    views[2].fps[("world", 1)] = ar(1, "5")   # rank 2 reaches position 1 late, with another shape
    d = find_desync(views, 3, compared)
    assert d is not None and d.kind == "shape" and d.seq == 1 and sorted(d.calls) == [0, 1, 2]
    # a compared position is trusted: without rank 2's new call, nothing is compared again
    views[0].fps[("world", 2)] = ar(2, "9")   # (a fingerprint never changes once posted; this proves the skip)
    del views[2].fps[("world", 1)]
    assert find_desync(views, 3, compared) is None
    views[2].fps[("world", 2)] = ar(2, "4")   # ... until a rank reaches it: then every holder is compared
    assert find_desync(views, 3, compared).seq == 2


def test_new_group_with_rank_dependent_ranks_is_proven_at_once_and_named_per_rank():
    calls = {0: Collective(GROUP_CREATION, 0, "new_group", ("ranks=[0, 1]",), (), Site(S, 26, "main")),
             1: Collective(GROUP_CREATION, 0, "new_group", ("ranks=[0]",), (), Site(S, 26, "main"))}
    views = {r: _view(r, [c], [("new_group", ("train.py", 26, "main"))]) for r, c in calls.items()}
    d = find_desync(views, 2)
    assert d is not None and d.reason == "desync" and d.group == GROUP_CREATION and d.seq == 0
    states = {r: RankState(rank=r, in_collective=c, sites_seen=frozenset(views[r].sites_seen))
              for r, c in calls.items()}
    verdict, fs = _diagnose.diagnose(JobEvidence(world_size=2, ranks=states), d.with_(blocked=True), {})
    f = fs[0]
    assert f.code == "DDP203" and f.ranks == [0, 1] and f.location.line == 26
    assert "process-group creation #0" in f.message
    assert "rank 0: new_group(ranks=[0, 1]) at train.py:26 (main); rank 1: new_group(ranks=[0]) at" in f.message
    assert "use_local_synchronization=True" in f.fix


# -- the probe: what it records of group creation and of calls on a group the rank is not in ---------------
@pytest.fixture
def rec(monkeypatch):
    r = Recorder()
    monkeypatch.setattr(hooks, "REC", r)
    return r


def new_group(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False,
              group_desc=None, device_id=None, sort_ranks=True):
    return "pg"


def test_probe_records_new_group_with_its_ranks_under_the_creation_sequence(rec, monkeypatch):
    monkeypatch.setattr(groups, "_world", lambda: 2)
    wrapped = hooks._wrap_collective(new_group, "new_group", groups.describer(new_group, groups._new_group))
    assert wrapped([1, 0]) == "pg" and wrapped() == "pg" and wrapped(ranks=[1], backend="gloo") == "pg"
    fps = snapshot(rec).fingerprints
    assert [(c.group, c.seq, c.op, c.shapes) for c in fps] == [
        (GROUP_CREATION, 0, "new_group", ("ranks=[0, 1]",)),
        (GROUP_CREATION, 1, "new_group", ("ranks=[0, 1]",)),   # ranks=None: every rank, the same group
        (GROUP_CREATION, 2, "new_group", ("ranks=[1]", "backend=gloo"))]
    assert fps[0].site is not None and fps[0].site.path == __file__
    assert rec.seq.get("world") is None  # the world group's own sequence is untouched


def test_probe_leaves_members_only_groups_and_non_member_calls_unrecorded(rec):
    wrapped = hooks._wrap_collective(new_group, "new_group", groups.describer(new_group, groups._new_group))
    wrapped([0, 1], use_local_synchronization=True)

    def all_reduce(tensor, op=None, group=None, async_op=False):
        return None

    hooks._wrap_collective(all_reduce, "all_reduce")(object(), group=-100)  # torch's NON_GROUP_MEMBER
    assert rec.seq == {} and not snapshot(rec).fingerprints


def test_device_mesh_and_subgroups_are_described_by_their_arguments():
    assert groups._device_mesh({"device_type": "cpu", "mesh_shape": (2, 2), "mesh_dim_names": ("dp", "tp")}) == \
        ("cpu", "mesh_shape=(2, 2)")
    assert groups._new_subgroups({"group_size": 2}) == ("group_size=2",)
    assert groups._by_enumeration({"ranks_per_subgroup_list": [[0, 1], [2, 3]]}) == ("ranks=[[0, 1], [2, 3]]",)
    assert {name for _m, name, _d in groups.CREATORS} == {"new_group", "new_subgroups",
                                                          "new_subgroups_by_enumeration", "init_device_mesh"}


def test_group_key_of_a_non_member_group_is_none_and_a_recycled_id_is_asked_anew(monkeypatch):
    """torch's get_process_group_ranks(NON_GROUP_MEMBER) answers with the last non-member group's ranks: such
    a call (a no-op on this rank) was recorded as that group's and paired with its members' real calls."""
    import weakref

    from torch.distributed import distributed_c10d as c10d

    class Group:
        pass

    members = {}
    monkeypatch.setattr(c10d, "get_process_group_ranks", lambda g: members[g])
    monkeypatch.setattr(c10d, "_get_default_group", lambda: None)
    monkeypatch.setattr(groups, "_group_keys", {})
    a, b = Group(), Group()
    members[a], members[b], members[-100] = [0, 1], [2, 3], [0, 1]
    assert groups.group_key(a) == "pg:0,1"
    assert groups.group_key(-100) is None
    groups._group_keys[id(b)] = (weakref.ref(a), "pg:0,1")  # as if b were created where a destroyed group lived
    assert groups.group_key(b) == "pg:2,3"


def test_where_a_rank_waits_inside_a_library_is_named_only_for_the_frame_that_called_torch():
    from ddp_doctor.diagnose.common import doing

    sp = "/v/lib/python3.11/site-packages/"
    fit = Site(S, 56, "main")
    coll = Collective("world", 27, "broadcast", ("1",), ("int64",), fit)
    lightning = (fit, Site(sp + "lightning/pytorch/trainer/trainer.py", 630, "_fit_impl"),
                 Site(sp + "lightning/pytorch/loops/training_epoch_loop.py", 265, "_broadcast_sigterm_tensor"),
                 Site(sp + "torch/distributed/distributed_c10d.py", 3151, "broadcast"))
    assert doing(RankState(rank=1, in_collective=coll, stack=lightning)).endswith(
        "at train.py:56 (main) (inside lightning: training_epoch_loop.py:265 (_broadcast_sigterm_tensor))")
    # DDP's first construction importing dynamo (and sympy): the stack says nothing about a collective
    importing = (fit, Site(sp + "torch/nn/parallel/distributed.py", 842, "__init__"),
                 Site(sp + "torch/_dynamo/__init__.py", 13, "<module>"),
                 Site(sp + "sympy/utilities/lambdify.py", 17, "<module>"))
    assert doing(RankState(rank=1, in_collective=coll, stack=importing)).endswith("at train.py:56 (main)")


def _blocked_view(r, c, seq, t=10.0, **kw):
    st = RankState(rank=r, progress=5, t=t, seq=seq, in_collective=c, **kw)
    return SimpleNamespace(rank=r, state=st, fps={}, sites_seen=set(), exit=None)


def _node_cycle(blocking=True, wait=2.0, t1=10.0, rank1_seq=None):
    """Rank 0 blocked in pg:0,1 #0 (line 48); rank 1 blocked in world #5 (the gradient all-reduce)."""
    c0 = Collective("pg:0,1", 0, "all_reduce", ("1",), ("float32",), Site(S, 48, "main"), waiting_s=wait,
                    blocking=blocking)
    c1 = Collective("world", 5, "ddp.backward(allreduce_grads)", site=Site(S, 44, "main"), waiting_s=wait,
                    blocking=blocking)
    return {0: _blocked_view(0, c0, {"world": 5, "pg:0,1": 1}),
            1: _blocked_view(1, c1, rank1_seq or {"world": 6}, t=t1)}


def test_ranks_blocked_in_different_groups_waiting_for_each_other_are_proven_at_once():
    d = find_desync(_node_cycle(), 2)
    assert d is not None and d.reason == "desync" and d.kind == "cycle"
    assert (d.group, d.seq) == ("pg:0,1", 0) and set(d.calls) == {0, 1}
    states = {r: v.state.with_(sites_seen=frozenset({("ddp.backward(allreduce_grads)", ("train.py", 44, "main"))}
                                                    | ({("all_reduce", ("train.py", 48, "main"))} if r == 0 else set())))
              for r, v in _node_cycle().items()}
    verdict, fs = _diagnose.diagnose(JobEvidence(world_size=2, ranks=states), d.with_(blocked=True), {})
    assert verdict == "hang"
    assert fs[0].code == "DDP201" and fs[0].ranks == [0] and fs[0].location.line == 48
    assert "on pg:0,1 (ranks 0, 1)" in fs[0].message


@pytest.mark.parametrize("case", ["async", "short", "apart", "entered"])
def test_no_cycle_without_proof(case):
    """An issued asynchronous call (the rank may still overtake it), a wait shorter than CYCLE_S, states
    published too far apart to show one moment, or a peer that already entered the call: no verdict."""
    views = {"async": lambda: _node_cycle(blocking=False), "short": lambda: _node_cycle(wait=0.3),
             "apart": lambda: _node_cycle(t1=13.0), "entered": lambda: _node_cycle(rank1_seq={"world": 6, "pg:0,1": 1})}
    assert find_desync(views[case](), 2) is None


def _mesh_cycle(rank3_entered=False, rank2_async=False):
    """A 2x2 mesh, tp groups [0,1] [2,3], dp groups [0,2] [1,3]: ranks 0 and 3 blocked in their tp pair's
    all_reduce, ranks 1 and 2 in the dp group's all-gather: 0 waits for 1, 1 for 3, 3 for 2, 2 for 0."""
    def c(group, seq, op, blocking=True):
        return Collective(group, seq, op, ("1",), ("float32",), Site(S, 36 if op == "all_reduce" else 30, "main"),
                          waiting_s=2.0, blocking=blocking)
    return {0: _blocked_view(0, c("pg:0,1", 1, "all_reduce"), {"pg:0,1": 2, "pg:0,2": 12}),
            1: _blocked_view(1, c("pg:1,3", 12, "all_gather_single"), {"pg:0,1": 1, "pg:1,3": 13}),
            3: _blocked_view(3, c("pg:2,3", 0, "all_reduce"), {"pg:2,3": 1, "pg:1,3": 13 if rank3_entered else 12}),
            2: _blocked_view(2, c("pg:0,2", 12, "all_gather_single", blocking=not rank2_async),
                             {"pg:2,3": 0, "pg:0,2": 13})}


def test_four_ranks_waiting_round_a_cycle_of_two_groups_are_proven_at_once():
    d = find_desync(_mesh_cycle(), 4)
    assert d is not None and d.kind == "cycle" and set(d.calls) == {0, 1, 2, 3}


@pytest.mark.parametrize("case", ["entered", "async"])
def test_no_longer_cycle_without_proof(case):
    """Rank 3 already entered the dp all-gather rank 1 waits in (rank 1's call can still complete), or rank 2's
    call is an issued asynchronous one: the cycle is broken, no verdict."""
    views = _mesh_cycle(rank3_entered=case == "entered", rank2_async=case == "async")
    assert find_desync(views, 4) is None


def test_two_groups_of_the_same_ranks_keep_keys_of_their_own():
    """A gloo twin of a group (Megatron's data_parallel_group_gloo) has the same ranks: merged under one key,
    their sequences would pair calls of two groups.  The key's suffix is the creation order, which every
    member shares."""
    import torch.distributed as dist

    from ddp_doctor.diagnose.live import group_ranks

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        a, b = dist.new_group([0]), dist.new_group([0])
        assert (groups.group_key(a), groups.group_key(b)) == ("pg:0", "pg:0~1")
        assert group_ranks("pg:0~1", 1) == {0}
    finally:
        dist.destroy_process_group()


class _EntersWhileRead(Recorder):
    """A recorder whose rank thread enters a collective at a new line right after the publisher has read
    ``cur`` (the thread runs on while the publisher builds a state: the switch can fall anywhere)."""

    def __init__(self) -> None:
        self.armed = False
        super().__init__()

    @property
    def cur(self):
        got = self._cur
        if self.armed:
            self.armed = False
            self.coll_enter("world", "all_reduce", ("1",), ("float32",), (S, 24, "main"))
        return got

    @cur.setter
    def cur(self, value) -> None:
        self._cur = value


def test_a_published_call_is_one_the_rank_is_in_or_has_left_and_its_line_is_known():
    """Seed 385 (4 ranks, rank 2's last batch count one short): gloo aborted rank 2 in its first all_reduce at
    the final line before its stack was taken; its last post held that call's fingerprint but no current
    collective (read before the call was entered), so no fact placed it past the loop and the decision was
    lost (DDP201 at the all_reduce).  Whatever the thread does between the publisher's reads, every
    published fingerprint is the current collective or one the rank left, with its line."""
    rec = _EntersWhileRead()
    rec.coll_leave(rec.coll_enter("world", "ddp.backward(allreduce_grads)", (), (), (S, 21, "main"), "ddp"))
    rec.armed = True
    st = snapshot(rec)
    assert not rec.armed and rec.cur is not None  # the rank did enter the all_reduce during the snapshot
    assert all(c.site is not None for c in st.fingerprints)
    newest = max(st.fingerprints, key=lambda c: c.seq)
    shown = [c for c in (st.in_collective, st.last_collective) if c is not None]
    assert any((c.group, c.seq) == (newest.group, newest.seq) and c.site == newest.site for c in shown)
    again = snapshot(rec)  # the next post: the call is current, with its line
    assert again.in_collective.site == Site(S, 24, "main") and again.fingerprints[-1].site == Site(S, 24, "main")
