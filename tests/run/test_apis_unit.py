"""The API table (ddp_doctor.apis) and the probe's walk that names the API a collective was issued inside."""
from __future__ import annotations

import sys

from ddp_doctor import apis
from ddp_doctor.evidence import Collective, Site
from ddp_doctor.evidence.rank import RankState
from ddp_doctor.diagnose.apiwords import called, op_text, why_all
from ddp_doctor.probe.apisite import user_site_api

TORCH = "/venv/lib/python3.11/site-packages/torch/"


def _torch_fn(path: str, src: str, name: str, env: dict):
    exec(compile(src, TORCH + path, "exec"), env)
    return env[name]


def test_table_entries_are_unique_and_found_by_file_and_qualname():
    keys = [(a.path, a.qualname) for a in apis.TABLE]
    assert len(keys) == len(set(keys))
    a = apis.lookup(TORCH + "distributed/checkpoint/state_dict_saver.py", "save")
    assert a is not None and a.name == "dcp.save"
    assert apis.lookup(TORCH + "distributed/checkpoint/state_dict_loader.py", "save") is None
    assert apis.lookup("/home/me/state_dict_saver.py", "save") is None
    assert "every rank must call it" in apis.collective_why("dcp.save")


def test_walk_records_the_outermost_api_below_the_user_frame():
    env: dict = {"sys": sys, "probe": user_site_api}
    _torch_fn("distributed/distributed_c10d.py", "def gather_object():\n    return probe(sys._getframe())\n",
              "gather_object", env)
    _torch_fn("distributed/checkpoint/utils.py", "def reduce_scatter():\n    return gather_object()\n",
              "reduce_scatter", env)
    save = _torch_fn("distributed/checkpoint/state_dict_saver.py", "def save():\n    return reduce_scatter()\n",
                     "save", env)
    site = save()  # this line is the user's
    assert site[0] == __file__ and site[2] == "test_walk_records_the_outermost_api_below_the_user_frame"
    assert site[3] == "dcp.save"


def test_direct_call_costs_one_frame_and_names_no_api():
    site = user_site_api(sys._getframe())
    assert len(site) == 3 and site[0] == __file__


def test_site_api_travels_on_the_wire():
    s = Site("/x/train.py", 46, "main", "dcp.save")
    assert Site.from_json(s.to_json()) == s and Site.from_json(s.to_list()) == s
    assert Site.from_json(Site("/x/train.py", 3).to_list()).api is None
    c = Collective("world", 40, "gather_object", site=s)
    st = RankState(rank=0, in_collective=c, fingerprints=(c,))
    back = RankState.from_json(st.to_json())
    assert back.in_collective.site.api == "dcp.save" and back.fingerprints[0].site.api == "dcp.save"


def test_words_name_the_api_with_the_collective_as_detail():
    c = Collective("world", 40, "gather_object", site=Site("/x/train.py", 46, "main", "dcp.save"))
    assert called(c, c.site) == "entered `dcp.save` at train.py:46 (main)"
    assert op_text(c) == "`dcp.save` (gather_object inside it)"
    assert "`dcp.save` is collective: every rank must call it" in why_all(c)
    plain = Collective("world", 1, "barrier", site=Site("/x/train.py", 3, "main"))
    assert called(plain, plain.site) == "called barrier() at train.py:3 (main)" and why_all(plain) == ""


def _fsdp_rank(r: int, calls, seen, **kw) -> RankState:
    fps = tuple(Collective("world", s, "all_gather_single", ("1088", "544"), ("float32",) * 2, site=site)
                for s, site in calls)
    return RankState(rank=r, fingerprints=fps, sites_seen=frozenset(("all_gather_single", k) for k in seen), **kw)


def test_api_parting_finds_the_rank_that_alone_ran_the_sharded_model():
    from ddp_doctor.diagnose.apiwords import api_parting
    from ddp_doctor.evidence import ExitStatus

    fwd = "the forward of an FSDP2 (`fully_shard`) module"
    train, ev = Site("/x/t.py", 47, "main", fwd), Site("/x/t.py", 32, "evaluate", fwd)
    r0 = _fsdp_rank(0, [(1, train), (2, ev)], [train.key(), ev.key()])
    r1 = _fsdp_rank(1, [(1, train), (2, train)], [train.key()])
    fault, calls = api_parting({0: r0, 1: r1})
    assert fault == [0] and calls[0].site == ev
    # both ranks ran both lines: no one alone
    r1b = _fsdp_rank(1, [(1, train), (2, train)], [train.key(), ev.key()])
    assert api_parting({0: r0, 1: r1b}) is None
    # a rank gloo killed posted up to position 1: past it, judged by its last post
    dead = _fsdp_rank(1, [(1, train)], [train.key()], exit=ExitStatus(-6, "SIGABRT"))
    fault, calls = api_parting({0: r0, 1: dead})
    assert fault == [0] and calls[1] is None
    # the same rank alive (it has not posted past position 1 yet): nothing known past it
    assert api_parting({0: r0, 1: _fsdp_rank(1, [(1, train)], [train.key()])}) is None


def test_a_rank_that_ran_the_sharded_model_once_more_is_the_culprit_not_the_one_that_went_on():
    from ddp_doctor.diagnose.apiwords import more_often
    from ddp_doctor.evidence.records import SiteCount

    fwd = Site("/x/s.py", 23, "score", "the forward of an FSDP2 (`fully_shard`) module")
    after = Site("/x/s.py", 41, "main")

    def st(r, n, seen):
        return RankState(rank=r, site_counts=(SiteCount("all_gather_single", fwd, n),),
                         sites_seen=frozenset(("all_gather_single", s.key()) for s in seen))

    calls = {0: Collective("world", 12, "all_gather_single", site=fwd), 1: Collective("world", 12, "all_reduce",
                                                                                      site=after)}
    fault, counts = more_often(calls, {0: st(0, 13, [fwd]), 1: st(1, 12, [fwd])})
    assert fault == [0] and "rank 0: 13, rank 1: 12" in counts
    # rank 1 never ran the forward at all: not a longer loop (a rank-conditional call instead)
    assert more_often(calls, {0: st(0, 13, [fwd]), 1: st(1, 0, [])}) is None

    # the one policy asks it, so a hang (both stuck there) gets the same culprit, worded with how it showed
    from ddp_doctor.diagnose.blame import MORE_OFTEN, blame_calls
    from ddp_doctor.diagnose.collectives import finding_for_blame
    from ddp_doctor.diagnose.stuck import Kind, Standing, judge

    ranks = {0: st(0, 13, [fwd]), 1: st(1, 12, [fwd])}
    b = blame_calls(calls, [], ranks)
    assert (b.code, b.ranks, b.site, b.why) == ("DDP201", (0,), fwd, MORE_OFTEN)

    class Stuck2:
        def standings(self):
            return {r: Standing(r, c) for r, c in calls.items()}

        def history(self):
            return ranks

        def lint(self):
            return ()

    j = judge(Stuck2())
    assert j.kind == Kind.PAIRED and j.blame == b
    f = finding_for_blame(j.blame, calls, ranks, "world", 12, "No rank progressed for 60s")
    assert f.ranks == [0] and "more often than the other ranks (all_gather_single calls at that line: " \
        "rank 0: 13, rank 1: 12)" in f.said
    assert "No rank progressed for 60s" in f.said and "Detected as it happened" not in f.said


def test_lint_names_the_rank_conditional_side_when_both_lines_are_new():
    """Each rank at a line the others never ran: no position names a culprit, lint's flag on one side does
    (the same rule for every source: ``blame_calls``), unless another rank ran that line too."""
    from types import SimpleNamespace

    from ddp_doctor.diagnose.blame import blame_calls

    save = Site("/x/t.py", 34, "main", "dcp.save")
    barrier = Site("/x/t.py", 35, "main")
    calls = {0: Collective("world", 40, "gather_object", site=save),
             1: Collective("world", 40, "barrier", site=barrier)}
    ranks = {r: RankState(rank=r) for r in calls}
    flagged = [SimpleNamespace(code="DDP201", path="/y/t.py", line=34, cause=None)]
    assert blame_calls(calls, flagged, ranks).unpack() == ("DDP201", [0], save)
    assert blame_calls(calls, [], ranks).code == "DDP203"
    both = flagged + [SimpleNamespace(code="DDP201", path="/y/t.py", line=35, cause=None)]
    assert blame_calls(calls, both, ranks).code == "DDP203"
    seen = {1: RankState(rank=1, sites_seen=frozenset({("gather_object", save.key())}))}
    # rank 1 ran that line too: not lint's branch; the history names rank 1's barrier, at a line rank 0 never ran
    b = blame_calls(calls, flagged, {**ranks, **seen})
    assert b.unpack() == ("DDP201", [1], barrier) and not b.lint_seen
    assert blame_calls(calls, flagged).unpack() == ("DDP201", [0], save)  # no history: lint's flag stands


def test_the_stage_that_ran_the_pipeline_step_more_often_is_the_culprit():
    from ddp_doctor.apis import STEP_OP
    from ddp_doctor.diagnose.pipeline import ran_schedule_more
    from ddp_doctor.evidence.records import SiteCount

    line = Site("/x/p.py", 25, "main")

    def st(r, n):
        return RankState(rank=r, site_counts=(SiteCount(STEP_OP, line, n),))

    fault, counts, site = ran_schedule_more({0: st(0, 4)}, {0: st(0, 4), 1: st(1, 3)})
    assert fault == [0] and counts == {0: 4, 1: 3} and site == line
    # the same count on every stage: the rank-conditional collective is the story, not the schedule
    assert ran_schedule_more({0: st(0, 3)}, {0: st(0, 3), 1: st(1, 3)}) is None
    assert ran_schedule_more({0: RankState(rank=0)}, {0: RankState(rank=0), 1: RankState(rank=1)}) is None


def test_a_rank_killed_by_sigsegv_with_no_stack_is_judged_by_the_call_it_posted_it_was_inside():
    """gloo's mismatch can end a rank by SIGSEGV before faulthandler dumps its stack (CI: objects_list_lengths,
    rank 1 killed by SIGSEGV with no stack): its posted in-flight call (inside it, blocking) is its call, so the
    mismatch (objects=3 against objects=2) is DDP203 -- not only "rank 1 was killed"."""
    from ddp_doctor.diagnose.collectives import diagnose_fatal_collective, fatal_call
    from ddp_doctor.evidence import ExitStatus, JobEvidence, RaisedError

    at = Site("/x/t.py", 22, "main")
    mine = Collective("world", 5, "broadcast_object_list", ("objects=2", "root=0"), site=at, blocking=True)
    killed = RankState(rank=1, in_collective=mine, exit=ExitStatus(-11, "SIGSEGV"))
    assert fatal_call(killed) == mine
    assert fatal_call(killed.with_(in_collective=Collective("world", 5, "broadcast_object_list", site=at))) is None
    theirs = Collective("world", 5, "broadcast_object_list", ("objects=3", "root=0"), site=at)
    r0 = RankState(rank=0, last_collective=theirs, fingerprints=(theirs,),
                   exc=RaisedError("RuntimeError", "builtins", "Connection reset by peer", at, (at,), True, theirs))
    [f] = diagnose_fatal_collective(JobEvidence(2, {0: r0, 1: killed.with_(fingerprints=(mine,))}))
    assert f.code == "DDP203" and f.location.line == 22


def test_a_line_another_rank_stands_at_now_is_one_it_reached():
    """Rank 1 was killed (its history is not trusted) and rank 2's post is old: rank 0's all_reduce line is not
    "a line the other ranks have not reached" while rank 1 stands at that very line (CI: a report said so)."""
    from ddp_doctor.diagnose.blame import blame_calls
    from ddp_doctor.evidence import ExitStatus

    end, init = Site("/x/t.py", 30, "main"), Site("/x/t.py", 15, "main")
    calls = {0: Collective("world", 5, "all_reduce", ("1",), site=end), 1: Collective("world", 5, "all_reduce", ("1",), site=end),
             2: Collective("world", 0, "ddp.init(broadcast_params)", site=init)}
    seen = frozenset({("all_reduce", end.key())})
    ranks = {0: RankState(rank=0, sites_seen=seen), 1: RankState(rank=1, sites_seen=seen, exit=ExitStatus(-6, "SIGABRT")),
             2: RankState(rank=2)}
    b = blame_calls(calls, [], ranks)
    assert not (b.code == "DDP201" and b.ranks == (0,)), b
