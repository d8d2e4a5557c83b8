"""diagnose/ on synthetic evidence: fast, no processes."""
from __future__ import annotations

from ddp_doctor import diagnose as _diagnose
from ddp_doctor.evidence import ExitStatus, JobEvidence, Verdict
from ddp_doctor.watcher.stacks import parse_faulthandler

S = "/u/train.py"


def diagnose(ev, decision, failures=None):
    """diagnose() on evidence written in its wire form (what the probe and the watcher post)."""
    return _diagnose.diagnose(JobEvidence.from_json(ev), Verdict.from_json(decision),
                              {r: ExitStatus.from_json(x) for r, x in (failures or {}).items()})


def site(line, fn="main"):
    return {"path": S, "line": line, "function": fn}


def rank(r, **kw):
    st = {"rank": r, "progress": 10, "step": 5, "steps_by_epoch": [5], "forwards": 5, "sites": [], "site_counts": [],
          "loaders": [], "stack": [], "workers": [], "exit": None}
    st.update(kw)
    return st


def test_rank_conditional_barrier_is_ddp201():
    ev = {"ranks": {
        0: rank(0, in_collective={"group": "world", "seq": 12, "op": "barrier", "site": site(20)},
                sites=[[S, 20, "main"], [S, 17, "main"]],
                site_counts=[["barrier", 0, 1], ["ddp.backward(allreduce_grads)", 1, 11]]),
        1: rank(1, in_collective={"group": "world", "seq": 12, "op": "ddp.backward(allreduce_grads)", "site": site(17)},
                sites=[[S, 17, "main"]], site_counts=[["ddp.backward(allreduce_grads)", 0, 12]])}}
    for r in ev["ranks"].values():
        r["sites_seen"] = [[op, ["train.py", r["sites"][i][1], "main"]] for op, i, _ in r["site_counts"]]
    calls = {r: st["in_collective"] for r, st in ev["ranks"].items()}
    verdict, fs = diagnose(ev, {"reason": "desync", "kind": "op", "group": "world", "seq": 12, "calls": calls,
                                "blocked": True})
    assert verdict == "hang"
    assert fs[0].code == "DDP201" and fs[0].ranks == [0] and fs[0].location.line == 20


def test_shape_mismatch_same_line_is_ddp203_all_ranks():
    calls = {0: {"op": "all_gather", "shapes": ["10"], "dtypes": ["float32"], "site": site(43)},
             1: {"op": "all_gather", "shapes": ["11"], "dtypes": ["float32"], "site": site(43)}}
    ev = {"ranks": {r: rank(r, sites_seen=[["all_gather", ["train.py", 43, "main"]]]) for r in (0, 1)}}
    verdict, fs = diagnose(ev, {"reason": "desync", "kind": "shape", "group": "world", "seq": 3, "calls": calls})
    assert verdict == "desync"
    assert fs[0].code == "DDP203" and fs[0].ranks == [0, 1]


def test_step_counts_that_differ_in_a_job_that_ended_well_are_no_finding():
    """Steps per epoch are inferred (loader passes, optimizer steps): a correct job has different ones (DDP's
    Join over an iterable stream, a rank-local optimizer).  A job that ended well keeps verdict ok."""
    ev = {"ranks": {0: rank(0, steps_by_epoch=[32, 32], step=64, done=True),
                    1: rank(1, steps_by_epoch=[31, 32], step=63, done=True)}}
    verdict, fs = diagnose(ev, None)
    assert verdict == "ok" and not [f for f in fs if f.code == "DDP101"]


def test_exception_root_cause_beats_consequence():
    ev = {"ranks": {
        0: rank(0, exc={"type": "RuntimeError", "message": "Connection closed by peer", "location": site(22),
                        "collective": {"op": "ddp.backward(allreduce_grads)", "site": site(22)}, "t": 5.0},
                exit={"exit_code": 1, "signal": None}),
        1: rank(1, exc={"type": "ValueError", "message": "bad sample", "location": site(10, "check"),
                        "collective": None, "t": 4.9}, exit={"exit_code": 1, "signal": None})}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert verdict == "crash"
    assert fs[0].code == "DDP204" and fs[0].ranks == [1] and fs[0].location.line == 10
    assert "ValueError" in fs[0].message


def test_a_broken_connection_recorded_first_is_still_the_consequence():
    """Both exceptions inside a collective, the broken connection recorded first (the failing rank posts its
    own after its DataLoader's teardown): the rank whose error is its own is the root, whatever the times
    (seen in CI under load: worker_killed blamed the rank that lost its peer).  And a broken connection
    against a rank that exited with an error and recorded none: that rank."""
    ddp = {"op": "ddp.backward(allreduce_grads)", "site": site(53)}
    ev = {"ranks": {
        0: rank(0, exc={"type": "RuntimeError", "message": "[pair.cc:553] Connection closed by peer",
                        "location": site(53), "collective": ddp, "t": 4.0}, exit={"exit_code": 1, "signal": None}),
        1: rank(1, exc={"type": "RuntimeError", "message": "DataLoader worker (pid 7) is killed by signal: Killed.",
                        "location": site(53), "collective": ddp, "t": 5.0}, exit={"exit_code": 1, "signal": None})}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert verdict == "crash" and fs[0].code == "DDP204" and fs[0].ranks == [1], [(f.code, f.ranks) for f in fs]
    del ev["ranks"][1]["exc"]
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert fs[0].code == "DDP204" and fs[0].ranks == [1], [(f.code, f.ranks) for f in fs]
    # the dead worker's batch fails first in the rank's own loop ('Connection reset by peer' from its queue),
    # recorded after the peer's broken connection: the rank whose worker the probe found dead, at its loader
    ev["ranks"][1]["exc"] = {"type": "ConnectionResetError", "message": "[Errno 104] Connection reset by peer",
                             "location": site(51), "collective": None, "t": 5.0}
    ev["ranks"][1]["loaders"] = [{"site": site(45), "num_workers": 2, "worker_pids": [7, 8],
                                  "worker_exits": [{"pid": 7, "exit_code": None, "signal": "SIGKILL"}]}]
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert fs[0].code == "DDP204" and fs[0].ranks == [1] and fs[0].location.line == 45, [
        (f.code, f.ranks, f.location) for f in fs]


def test_sigkill_named_with_oom_hint():
    ev = {"ranks": {0: rank(0, in_collective={"group": "world", "seq": 9, "op": "all_reduce", "site": site(30)}),
                    1: rank(1, where=site(18))}}
    verdict, fs = diagnose(ev, {"reason": "exit"}, failures={1: {"exit_code": -9, "signal": "SIGKILL"}})
    assert verdict == "crash" and fs[0].code == "DDP204" and fs[0].ranks == [1]
    assert "SIGKILL" in fs[0].message and "out-of-memory" in fs[0].message


def test_loader_stall_points_at_worker_line():
    w = [{"pid": 7, "stack": [site(40, "<module>"), {"path": S, "line": 17, "function": "__getitem__"},
                              {"path": "/x/site-packages/torch/utils/data/_utils/fetch.py", "line": 1, "function": "f"}]}]
    ev = {"ranks": {r: rank(r, in_data_wait={"loader": 0, "waiting_s": 6.0}, where=site(27), workers=w) for r in (0, 1)}}
    verdict, fs = diagnose(ev, {"reason": "hang", "stalled_s": 6.0, "limit_s": 5.0})
    assert verdict == "hang" and fs[0].code == "DDP205" and fs[0].ranks == [0, 1]
    assert fs[0].location.line == 17


def test_sampler_without_set_epoch_is_a_warning_on_an_ok_run():
    ld = {"site": site(13), "sampler": {"type": "DistributedSampler", "shuffle": True, "set_epoch_calls": 0,
                                        "epochs_seen": [0, 0, 0]}}
    ev = {"ranks": {r: rank(r, loaders=[ld]) for r in (0, 1)}}
    verdict, fs = diagnose(ev, None)
    assert verdict == "ok" and [f.code for f in fs if f.code == "DDP102"] == ["DDP102"]
    assert fs[0].severity.value == "warning"


def test_parse_faulthandler_main_thread():
    text = """Thread 0x00007f (most recent call first):
  File "/x/threading.py", line 320 in wait
  File "/x/threading.py", line 1002 in _bootstrap

Current thread 0x00007e (most recent call first):
  File "/x/torch/distributed/distributed_c10d.py", line 3252 in all_reduce
  File "/u/train.py", line 41 in main
  File "/u/train.py", line 50 in <module>
"""
    st = parse_faulthandler(text)
    assert st[0].function == "<module>" and st[-1].function == "all_reduce" and st[1].line == 41


def _barrier_vs_training(epoch_of_rank1, lint):
    """Rank 1 in a barrier at line 55 (epoch ``epoch_of_rank1``) while rank 0 trains in epoch 3."""
    ev = {"lint": lint, "ranks": {
        0: rank(0, sites=[[S, 42, "main"], [S, 55, "main"]],
                site_counts=[["ddp.backward(allreduce_grads)", 0, 13]]),
        1: rank(1, sites=[[S, 42, "main"], [S, 55, "main"]],
                site_counts=[["ddp.backward(allreduce_grads)", 0, 12], ["barrier", 1, 1]])}}
    for r in ev["ranks"].values():
        r["sites_seen"] = [[op, ["train.py", r["sites"][i][1], "main"]] for op, i, _ in r["site_counts"]]
    calls = {0: {"op": "ddp.backward(allreduce_grads)", "site": site(42), "epoch": 3, "step_in_epoch": 0},
             1: {"op": "barrier", "site": site(55), "epoch": epoch_of_rank1, "step_in_epoch": 4}}
    return diagnose(ev, {"reason": "desync", "kind": "op", "group": "world", "seq": 13, "calls": calls,
                         "blocked": True})


def test_rank_that_left_the_loop_early_is_ddp101_at_the_break_lint_found():
    verdict, fs = _barrier_vs_training(2, [{"code": "DDP101", "path": S, "line": 53}])
    assert fs[0].code == "DDP101" and fs[0].ranks == [1] and fs[0].location.line == 53


def test_epoch_end_barrier_under_rank_guard_stays_ddp201():
    # same runtime picture, but the script's barrier itself is rank-conditional (lint says so)
    verdict, fs = _barrier_vs_training(2, [{"code": "DDP201", "path": S, "line": 55},
                                           {"code": "DDP101", "path": S, "line": 53}])
    assert fs[0].code == "DDP201" and fs[0].location.line == 55
    # and without a statically located exit from the loop, the runtime does not guess DDP101
    verdict, fs = _barrier_vs_training(2, [])
    assert fs[0].code == "DDP201"
    # same epoch: nobody left the loop
    verdict, fs = _barrier_vs_training(3, [{"code": "DDP101", "path": S, "line": 53}])
    assert fs[0].code == "DDP201"


def test_barrier_before_first_step_blames_the_rank_that_never_trained():
    """Rank 0 waits in a rank-0-only barrier before any step; rank 1 is in its first backward. Neither has
    run the other's line: the rank with no DDP forward at all is the odd one out (DDP201), not DDP202."""
    ev = {"ranks": {
        0: rank(0, step=0, forwards=0, steps_by_epoch=[],
                in_collective={"group": "world", "seq": 1, "op": "barrier", "site": site(13)},
                sites=[[S, 10, "main"], [S, 13, "main"]],
                site_counts=[["ddp.init(broadcast_params)", 0, 1], ["barrier", 1, 1]]),
        1: rank(1, step=0, forwards=1, steps_by_epoch=[],
                in_collective={"group": "world", "seq": 1, "op": "ddp.backward(allreduce_grads)", "site": site(17)},
                sites=[[S, 10, "main"], [S, 15, "main"], [S, 17, "main"]],
                site_counts=[["ddp.init(broadcast_params)", 0, 1], ["ddp.forward", 1, 1],
                             ["ddp.backward(allreduce_grads)", 2, 1]])}}
    for r in ev["ranks"].values():
        r["sites_seen"] = [[op, ["train.py", r["sites"][i][1], "main"]] for op, i, _ in r["site_counts"]]
    calls = {r: st["in_collective"] for r, st in ev["ranks"].items()}
    verdict, fs = diagnose(ev, {"reason": "desync", "kind": "op", "group": "world", "seq": 1, "calls": calls,
                                "blocked": True})
    assert verdict == "hang"
    assert fs[0].code == "DDP201" and fs[0].ranks == [0] and fs[0].location.line == 13


def test_restarted_ranks_that_cannot_connect_are_ddp501():
    """Attempt >= 1 with the agent's shared store: a connect failure in init_process_group is the stale store."""
    tb = [site(18), {"path": "/t/torch/distributed/distributed_c10d.py", "line": 1899, "function": "init_process_group"}]
    exc = {"type": "RuntimeError", "message": "Gloo connectFullMesh failed with ... timed out connecting: SO_ERROR: "
           "Connection refused, remote=[127.0.0.1]:49076", "location": site(18), "traceback": tb, "collective": None,
           "t": 9.0}
    ev = {"ranks": {0: rank(0, step=0, forwards=0, attempt=1, agent_store=True, exc=exc,
                            exit={"exit_code": 1, "signal": None}),
                    1: rank(1, step=0, forwards=0, attempt=1, agent_store=True)}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert verdict == "crash"
    assert fs[0].code == "DDP501" and fs[0].ranks == [0] and fs[0].location.line == 18
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in fs[0].fix
    # the same failure in the first attempt (no stale keys), or with a fresh store per attempt, is not that
    for kw in ({"attempt": 0}, {"agent_store": False}):
        ev0 = {"ranks": {0: rank(0, step=0, forwards=0, exc=exc, exit={"exit_code": 1, "signal": None},
                                 **{"attempt": 1, "agent_store": True, **kw}),
                         1: rank(1, step=0, forwards=0)}}
        _, fs0 = diagnose(ev0, {"reason": "exit", "rank": 0})
        assert fs0[0].code == "DDP204", fs0[0]


def test_restarted_ranks_stuck_connecting_are_ddp501():
    """The stale address's port may belong to another process by now: the connect then blocks, a hang."""
    stack = [site(18), {"path": "/t/torch/distributed/distributed_c10d.py", "line": 1899,
                        "function": "init_process_group"}]
    ev = {"ranks": {r: rank(r, step=0, forwards=0, attempt=2, agent_store=True, stack=stack, where=site(18))
                    for r in (0, 1)}}
    verdict, fs = diagnose(ev, {"reason": "hang", "stalled_s": 300, "limit_s": 300})
    assert verdict == "hang"
    assert fs[0].code == "DDP501" and fs[0].ranks == [0, 1] and fs[0].location.line == 18
    assert "attempt 2" in fs[0].message


def test_lint_confirmation_needs_the_same_hazard():
    """A runtime DDP102 on a DataLoader line does not "confirm" lint's DDP401 on that line; lint's DDP201 at a
    line the runtime names DDP202/203 does (the same ranks-out-of-step hazard)."""
    from ddp_doctor.diagnose.common import same_hazard as _same_hazard

    assert _same_hazard("DDP102", "DDP102")
    assert not _same_hazard("DDP401", "DDP102")
    assert _same_hazard("DDP201", "DDP203") and _same_hazard("DDP101", "DDP204")
    assert not _same_hazard("DDP303", "DDP204")


def test_a_rank0_forward_that_issued_no_collective_is_not_ddp202():
    """nanoGPT's rank-0 evaluation through a DDP model without buffers issues no collective: when something
    else fails (rank 1 raises), the report blames that, never the harmless evaluation forwards."""
    exc = {"type": "ValueError", "message": "corrupt record", "location": site(22, "get_batch"), "traceback": []}
    ev = {"ranks": {
        0: rank(0, forwards=46, sites=[[S, 49, "main"], [S, 30, "estimate_loss"]],
                site_counts=[["ddp.forward", 0, 30], ["ddp.forward", 1, 16], ["ddp.backward(allreduce_grads)", 0, 30]],
                in_collective={"group": "world", "seq": 31, "op": "ddp.backward(allreduce_grads)", "site": site(49)}),
        1: rank(1, forwards=30, sites=[[S, 49, "main"]], exc=exc,
                site_counts=[["ddp.forward", 0, 30], ["ddp.backward(allreduce_grads)", 0, 30]])}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1}, {1: {"exit_code": 1}})
    assert verdict == "crash" and [f.code for f in fs] == ["DDP204"] and fs[0].ranks == [1]
    # the same evaluation with BatchNorm buffers: DDP broadcast them at that line on rank 0 only
    ev["ranks"][0]["site_counts"].append(["ddp.forward(broadcast_buffers)", 1, 16])
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1}, {1: {"exit_code": 1}})
    assert "DDP202" in [f.code for f in fs]


def test_an_abort_after_the_program_returned_is_torchs_teardown():
    """torch's gloo/DDP teardown race: the program returned (the probe saw it), then the process died of
    SIGABRT at exit. The training completed; the finding says so and how to avoid the race."""
    ev = {"ranks": {0: rank(0, done=True, exit_code=0, step=20, sites=[[S, 30, "main"]]),
                    1: rank(1, done=True, exit_code=0, step=20)}}
    verdict, fs = diagnose(ev, None, {1: {"exit_code": -6, "signal": "SIGABRT"}})
    assert verdict == "crash" and [f.code for f in fs] == ["DDP204"] and fs[0].ranks == [1]
    assert "training itself completed" in fs[0].message and "barrier" in fs[0].fix


def test_an_abort_in_destroy_process_group_is_torchs_teardown():
    ev = {"ranks": {0: rank(0, done=True, exit_code=0, step=16), 1: rank(1, teardown=True, step=16)}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1}, {1: {"exit_code": -6, "signal": "SIGABRT"}})
    assert [f.code for f in fs] == ["DDP204"] and "tearing down its process group" in fs[0].message


def test_an_abort_after_every_step_while_the_others_finished_is_teardown():
    """Rank 1 ran every step, the others finished normally, then it died of SIGABRT before its program
    could say it returned (its DDP model freed as main() returned): teardown, not a crash of the training."""
    ev = {"ranks": {0: rank(0, done=True, exit_code=0, step=16), 1: rank(1, step=16)}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1}, {1: {"exit_code": -6, "signal": "SIGABRT"}})
    assert [f.code for f in fs] == ["DDP204"] and fs[0].evidence.get("finished_program")
    # one step short of the others: a real crash during training
    ev["ranks"][1]["step"] = 15
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1}, {1: {"exit_code": -6, "signal": "SIGABRT"}})
    assert not fs[0].evidence.get("finished_program")


def test_a_collective_timeout_is_the_consequence_of_the_rank_it_waited_for():
    """monitored_barrier (or a short process-group timeout) raised on rank 0 while rank 1 was outside every
    collective: DDP205 on rank 1 at its line, not DDP204 on rank 0."""
    barrier = {"group": "world", "seq": 18, "op": "monitored_barrier", "site": site(47)}
    ev = {"ranks": {
        0: rank(0, exc={"type": "RuntimeError", "message": "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 8000 ms",
                        "location": site(47), "collective": barrier, "in_collective": True, "t": 9.0},
                exit={"exit_code": 1, "signal": None}),
        1: rank(1, where=site(40), stack=[site(40)],  # it passed that barrier in the epoch before
                sites_seen=[["monitored_barrier", ["train.py", 47, "main"]]])}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert verdict == "hang"
    assert [(f.code, f.ranks, f.location.line) for f in fs] == [("DDP205", [1], 40)]
    assert "the consequence, not the cause" in fs[0].message
    # an error of its own (not a timeout) stays the root cause
    ev["ranks"][0]["exc"]["message"] = "CUDA error: an illegal memory access was encountered"
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert verdict == "crash" and fs[0].code == "DDP204" and fs[0].ranks == [0]

    # a third rank that passed the barrier loses its connection to rank 0 when rank 0 raises: the same story
    # (generated job, 3 ranks: the broken connection was taken for the root cause, DDP204 on rank 1)
    ev["ranks"][0]["exc"]["message"] = "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 8000 ms"
    ev["ranks"][2] = rank(2, exc={"type": "RuntimeError", "location": site(47), "collective": barrier,
                                  "message": "Rank 2 successfully reached monitoredBarrier, but received errors while "
                                             "waiting for send/recv from rank 0. Connection closed by peer",
                                  "in_collective": True, "t": 9.1}, exit={"exit_code": 1, "signal": None})
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 2})
    assert verdict == "hang" and [(f.code, f.ranks, f.location.line) for f in fs] == [("DDP205", [1], 40)]
    # a broken connection alone (no rank timed out) is no wait
    ev["ranks"][0]["exc"]["message"] = "Connection reset by peer"
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 2})
    assert verdict == "crash"


def test_a_lost_node_whose_rank_finished_is_the_story_not_a_crash_of_the_diagnosis():
    """Seen in CI (2 nodes x 2 ranks): node 1's launcher went silent after its rank 2 had ended normally; the
    live verdict said "a rank finished"; the others then failed on broken connections.  With the lost node's
    ranks and their consequences taken out, no finished rank is left: the lost node is the finding (the
    diagnosis raised IndexError here and node 0 wrote no report)."""
    broken = {"type": "RuntimeError", "message": "Connection reset by peer", "location": site(30),
              "collective": {"group": "world", "seq": 40, "op": "ddp.backward(allreduce_grads)", "site": site(30)}}
    ev = {"ranks": {0: rank(0, exc=broken), 1: rank(1), 2: rank(2, done=True), 3: rank(3)},
          "lost_nodes": [{"node": 1, "host": "n1", "ranks": [2, 3], "silent_s": 12.0}]}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 2, "finished": True},
                           {0: {"exit_code": 1}, 1: {"exit_code": -15, "signal": "SIGTERM"}})
    assert verdict == "crash"
    assert fs and fs[0].code == "DDP204" and fs[0].ranks == [2, 3] and "went silent" in fs[0].message


def test_a_diagnosis_that_raises_keeps_the_verdict_and_says_so(monkeypatch):
    """A bug in a diagnosis module must not cost the user the verdict: diagnose_guarded keeps the live
    decision's verdict, gives no finding and the error in words (the report's diagnosis_error)."""
    def broken(*_a, **_k):
        raise IndexError("list index out of range")

    monkeypatch.setattr(_diagnose.hang, "diagnose_hang", broken)
    ev = JobEvidence.from_json({"ranks": {0: rank(0, in_collective={"group": "world", "seq": 3, "op": "barrier",
                                                                    "site": site(20)}), 1: rank(1)}})
    verdict, fs, error = _diagnose.diagnose_guarded(ev, Verdict.from_json({"reason": "hang", "stalled_s": 30}))
    assert (verdict, fs) == ("hang", []) and error.startswith("IndexError: list index out of range at ")
    ok = JobEvidence.from_json({"ranks": {r: rank(r, done=True) for r in (0, 1)}})
    assert _diagnose.diagnose_guarded(ok, None)[::2] == ("ok", None)
