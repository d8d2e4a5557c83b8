"""torch's errors in the user's words, on synthetic evidence (fast, no processes): DDP's unused-parameter
error, a killed DataLoader worker, mismatched dtypes/shapes spelled out per rank, DDP510."""
from __future__ import annotations

from ddp_doctor import diagnose as _diagnose
from ddp_doctor.evidence import ExitStatus, JobEvidence, Verdict
from ddp_doctor.evidence.torch_errors import signal_name, unused_params, worker_died

S = "/u/train.py"
REDUCTION = ("Expected to have finished reduction in the prior iteration before starting a new one. This error "
             "indicates that your module has parameters that were not used in producing loss. You can enable "
             "unused parameter detection by passing the keyword argument `find_unused_parameters=True` to "
             "`torch.nn.parallel.DistributedDataParallel`, and by \nmaking sure all `forward` function outputs "
             "participate in calculating loss. \n")
OUTPUTS = ("Expected to have finished reduction in the prior iteration before starting a new one. This error "
           "indicates that your module has parameters that were not used in producing loss. Since "
           "`find_unused_parameters=True` is enabled, this likely  means that not all `forward` outputs "
           "participate in computing loss. You can fix this by making sure all `forward` function outputs "
           "participate in calculating loss.\n")


def diagnose(ev, decision, failures=None):
    return _diagnose.diagnose(JobEvidence.from_json(ev), Verdict.from_json(decision),
                              {r: ExitStatus.from_json(x) for r, x in (failures or {}).items()})


def site(line, fn="main"):
    return {"path": S, "line": line, "function": fn}


def rank(r, **kw):
    st = {"rank": r, "world_size": 2, "progress": 10, "step": 5, "steps_by_epoch": [5], "forwards": 5, "sites": [],
          "site_counts": [], "loaders": [], "stack": [], "workers": [], "exit": None,
          "group": {"size": 2, "rank": r, "site": site(10), "backend": "gloo", "collectives": 12},
          "collectives": {"count": 12, "time_s": 0.1}, "seq": {"world": 12}}
    st.update(kw)
    return st


def ddp(*named, find_unused=False):
    return [{"site": site(30), "find_unused_parameters": find_unused, "broadcast_buffers": True, "buffers": 0,
             "params": 6, "unused_seen": None,
             "named_params": [{"index": i, "name": n, "module_type": t} for i, n, t in named]}]


def exc(message, line=40, collective=None, t=5.0, typ="RuntimeError"):
    return {"type": typ, "message": message, "location": site(line), "collective": collective, "t": t}


# -- torch's messages read into records --------------------------------------------------------------
def test_unused_parameter_error_is_read_with_rank_indices_and_variant():
    u = unused_params(REDUCTION + "Parameter indices which did not receive grad for rank 1: 2 3\n In addition, ...")
    assert (u.rank, u.indices, u.more, u.find_unused, u.static_graph) == (1, (2, 3), 0, False, False)
    many = unused_params(OUTPUTS + "Parameter indices which did not receive grad for rank 0: "
                         + " ".join(map(str, range(100))))
    assert many.find_unused and len(many.indices) == 64 and many.more == 36
    detail = unused_params(REDUCTION + "Parameters which did not receive grad for rank 0: head.weight, head.bias")
    assert detail.names == ("head.weight", "head.bias") and detail.rank == 0
    assert unused_params("Connection closed by peer") is None and unused_params(None) is None


def test_dead_worker_messages_are_read():
    assert signal_name("Killed") == "SIGKILL" and signal_name("Bus error") == "SIGBUS"
    k = worker_died("DataLoader worker (pid 8864) is killed by signal: Killed. ")
    assert (k.pids, k.signal, k.exit_code) == ((8864,), "SIGKILL", None)
    b = worker_died("DataLoader worker (pid 7) is killed by signal: Bus error. It is possible that dataloader's "
                    "workers are out of shared memory. Please try to raise your shared memory limit.")
    assert b.signal == "SIGBUS" and b.shm
    e = worker_died("DataLoader worker (pid 12) exited unexpectedly with exit code 3. Details are lost due to ...")
    assert (e.pids, e.exit_code) == ((12,), 3)
    assert worker_died("DataLoader worker (pid(s) 12, 13) exited unexpectedly").pids == (12, 13)
    assert worker_died("ValueError: bad sample") is None


# -- DDP204: unused parameters ------------------------------------------------------------------------
def test_unused_parameters_on_one_rank_are_named_at_the_ddp_line():
    ev = {"ranks": {
        0: rank(0, in_collective={"group": "world", "seq": 1, "op": "ddp.backward(allreduce_grads)",
                                  "site": site(44)}, ddp=ddp()),
        1: rank(1, exc=exc(REDUCTION + "Parameter indices which did not receive grad for rank 1: 2 3"),
                ddp=ddp((2, "box_head.weight", "Linear"), (3, "box_head.bias", "Linear")),
                exit={"exit_code": 1, "signal": None})}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1})
    f = fs[0]
    assert verdict == "crash" and f.code == "DDP204" and f.ranks == [1]
    assert f.location.line == 30  # the DDP(...) line, where find_unused_parameters=True goes
    assert "`box_head.weight`, `box_head.bias` of module `box_head` (Linear)" in f.message
    assert "raised at train.py:40" in f.message and "2 3 for rank 1" in f.message
    assert "Only rank 1" in f.message and "branch of forward" in f.message
    assert "find_unused_parameters=True" in f.fix and "static_graph=True" in f.fix
    assert [p.name for p in f.evidence["unused_parameters"]["1"]] == ["box_head.weight", "box_head.bias"]


def test_unused_outputs_on_every_rank_make_one_finding_with_the_outputs_fix():
    named = ((4, "aux.weight", "Linear"), (5, "aux.bias", "Linear"))
    ev = {"ranks": {r: rank(r, exc=exc(OUTPUTS + f"Parameter indices which did not receive grad for rank {r}: 4 5",
                                       t=5.0 + r), ddp=ddp(*named, find_unused=True),
                            exit={"exit_code": 1, "signal": None}) for r in (0, 1)}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    f204 = [f for f in fs if f.code == "DDP204"]
    assert verdict == "crash" and len(f204) == 1 and f204[0].ranks == [0, 1]
    assert "`aux.weight`, `aux.bias` of module `aux` (Linear)" in f204[0].message
    assert "an output that the loss never used" in f204[0].message
    assert "cannot help here" in f204[0].fix


def test_unused_parameters_raised_in_ddps_buffer_broadcast_name_every_rank():
    """A model with buffers: the error escapes DDP's forward while it broadcasts buffers, so the ranks' errors
    look like failures inside a collective; every rank that raised it is still a cause."""
    fwd = {"group": "world", "seq": 3, "op": "ddp.forward(broadcast_buffers)", "site": site(40)}
    named = ((3, "aux.weight", "Linear"),)
    ev = {"ranks": {r: rank(r, exc=exc(REDUCTION + f"Parameter indices which did not receive grad for rank {r}: 3",
                                       collective=fwd, t=5.0 + r), ddp=ddp(*named),
                            exit={"exit_code": 1, "signal": None}) for r in (0, 1)}}
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    assert [(f.code, f.ranks) for f in fs if f.code == "DDP204"] == [("DDP204", [0, 1])]
    assert "No rank used them in the loss" in fs[0].message


def test_unused_indices_without_a_recorded_model_are_still_explained():
    ev = {"ranks": {
        0: rank(0, in_collective={"group": "world", "seq": 1, "op": "ddp.backward(allreduce_grads)", "site": site(44)}),
        1: rank(1, exc=exc(REDUCTION + "Parameter indices which did not receive grad for rank 1: 7"),
                exit={"exit_code": 1, "signal": None})}}
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1})
    assert fs[0].code == "DDP204" and "parameter indices 7" in fs[0].message and fs[0].location.line == 40


# -- DDP204: a killed DataLoader worker ---------------------------------------------------------------
def _loader(**kw):
    ld = {"site": site(25), "num_workers": 2, "worker_pids": [8861, 8864]}
    ld.update(kw)
    return ld


def test_killed_worker_is_blamed_on_its_loader_with_pid_and_signal():
    ev = {"ranks": {
        0: rank(0, in_collective={"group": "world", "seq": 4, "op": "ddp.backward(allreduce_grads)",
                                  "site": site(51)}),
        1: rank(1, exc=exc("DataLoader worker (pid 8864) is killed by signal: Killed. ", line=51),
                loaders=[_loader()], train_loader=0, exit={"exit_code": 1, "signal": None})}}
    verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1})
    f = fs[0]
    assert verdict == "crash" and f.code == "DDP204" and f.ranks == [1] and f.location.line == 25
    assert "worker (pid 8864) was killed by SIGKILL" in f.message and "likely out of memory" in f.message
    assert "check `dmesg`" in f.message and "train.py:51" in f.message and "not the cause" in f.message
    assert "smaller prefetch_factor" in f.fix


def test_worker_found_dead_by_the_probe_explains_another_error():
    """The worker's queued batch failed first (ConnectionResetError in next()): the probe's record of the dead
    worker (its own exit status) still names it."""
    ev = {"ranks": {
        0: rank(0),
        1: rank(1, exc=exc("[Errno 104] Connection reset by peer", typ="ConnectionResetError", line=49),
                loaders=[_loader(worker_exits=[{"pid": 8864, "exit_code": -9, "signal": "SIGKILL"}])],
                exit={"exit_code": 1, "signal": None})}}
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1})
    assert fs[0].location.line == 25 and "pid 8864" in fs[0].message and "SIGKILL" in fs[0].message


def test_bus_error_in_a_worker_points_at_shared_memory():
    ev = {"ranks": {0: rank(0), 1: rank(1, exc=exc(
        "DataLoader worker (pid 8861) is killed by signal: Bus error. It is possible that dataloader's workers are "
        "out of shared memory. Please try to raise your shared memory limit."), loaders=[_loader()],
        exit={"exit_code": 1, "signal": None})}}
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1})
    assert "SIGBUS" in fs[0].message and "/dev/shm" in fs[0].message and "--shm-size" in fs[0].fix


def test_other_exceptions_keep_their_own_line():
    ev = {"ranks": {0: rank(0), 1: rank(1, exc=exc("bad sample", typ="ValueError", line=12), loaders=[_loader()],
                                        exit={"exit_code": 1, "signal": None})}}
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 1})
    assert fs[0].location.line == 12 and "This is the root cause" in fs[0].message


# -- DDP203: each rank's dtype and shape -------------------------------------------------------------
def _mismatch(calls):
    ev = {"ranks": {r: rank(r, sites_seen=[["all_reduce", ["train.py", 47, "main"]]]) for r in calls}}
    return diagnose(ev, {"reason": "desync", "kind": "shape", "group": "world", "seq": 9,
                         "calls": {r: {"group": "world", "seq": 9, "op": "all_reduce", "site": site(47), **c}
                                   for r, c in calls.items()}})


def test_dtype_mismatch_states_each_ranks_dtype_and_shape():
    _verdict, fs = _mismatch({0: {"shapes": ["4"], "dtypes": ["float32"]}, 1: {"shapes": ["4"], "dtypes": ["float64"]}})
    assert fs[0].code == "DDP203" and "They pass different dtypes: rank 0: float32 [4], rank 1: float64 [4]." \
        in fs[0].message


def test_shape_mismatch_of_a_gather_lists_both_tensors():
    _verdict, fs = _mismatch({0: {"shapes": ["[50,50]", "50"], "dtypes": ["int64", "int64"]},
                              1: {"shapes": ["[49,49]", "49"], "dtypes": ["int64", "int64"]}})
    assert ("They pass different shapes: rank 0: list of int64 [50], [50] and int64 [50]; "
            "rank 1: list of int64 [49], [49] and int64 [49].") in fs[0].message


def test_calls_without_tensors_get_no_tensor_sentence():
    ev = {"ranks": {r: rank(r, sites_seen=[["barrier", ["train.py", 47, "main"]], ["barrier", ["train.py", 60, "main"]]])
                    for r in (0, 1)}}
    _verdict, fs = diagnose(ev, {"reason": "desync", "kind": "site", "group": "world", "seq": 9, "calls": {
        0: {"group": "world", "seq": 9, "op": "barrier", "site": site(47)},
        1: {"group": "world", "seq": 9, "op": "barrier", "site": site(60)}}})
    assert fs and not any("not recorded" in f.message or "They pass" in f.message for f in fs)


def test_a_rank_that_died_unposted_is_said_so():
    ev = {"ranks": {
        0: rank(0, in_collective={"group": "world", "seq": 9, "op": "all_reduce", "site": site(47),
                                  "shapes": ["2"], "dtypes": ["float32"]},
                stack=[site(47), {"path": "/x/torch/distributed/distributed_c10d.py", "line": 1, "function": "all_reduce"}],
                exit={"exit_code": -6, "signal": "SIGABRT"}),
        1: rank(1, in_collective={"group": "world", "seq": 9, "op": "all_reduce", "site": site(47),
                                  "shapes": ["2"], "dtypes": ["int64"]}),
    }}
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    f = next(f for f in fs if f.code == "DDP203")
    assert "#9 on world" in f.message and "rank 0: float32 [2], rank 1: int64 [2]" in f.message
    ev["ranks"][0]["in_collective"] = None  # it aborted before its probe posted the call
    _verdict, fs = diagnose(ev, {"reason": "exit", "rank": 0})
    f = next(f for f in fs if f.code == "DDP203")
    assert "rank 0: not recorded" in f.message and "rank 1: int64 [2]" in f.message


# -- DDP510: processes that never formed one group ---------------------------------------------------
def _alone(**group):
    g = {"size": 1, "rank": 0, "site": site(22), "backend": "gloo", "collectives": 40}
    g.update(group)
    return {"ranks": {r: rank(r, group=g, exit={"exit_code": 0, "signal": None}, done=True) for r in (0, 1)}}


def test_each_process_in_a_world_of_one_is_a_warning_at_the_init_line():
    verdict, fs = diagnose(_alone(), None)
    f = [f for f in fs if f.code == "DDP510"]
    assert verdict == "ok" and len(f) == 1 and f[0].severity.value == "warning" and f[0].ranks == [0, 1]
    assert f[0].location.line == 22
    assert "started 2 processes (WORLD_SIZE=2)" in f[0].message and "world size 1 in which it is rank 0" in f[0].message
    assert "without `world_size=`" in f[0].fix


def test_a_group_never_used_while_training_is_a_warning():
    ev = _alone(size=2, collectives=0)
    for st in ev["ranks"].values():
        st.update(collectives={"count": 0, "time_s": 0.0}, seq={})
    verdict, fs = diagnose(ev, None)
    f = [f for f in fs if f.code == "DDP510"]
    assert verdict == "ok" and len(f) == 1 and "never used it" in f[0].message
    assert "ACCELERATE_USE_CPU=1" in f[0].fix
    ev["ranks"][1]["group"] = {"size": 0, "rank": -1}  # no group at all
    assert [f for f in diagnose(ev, None)[1] if f.code == "DDP510"]


def test_one_group_and_unknown_groups_are_not_warned():
    assert not [f for f in diagnose(_alone(size=2), None)[1] if f.code == "DDP510"]
    ev = _alone(size=2, collectives=0)
    for st in ev["ranks"].values():
        st.update(collectives={"count": 0, "time_s": 0.0}, seq={}, group=None)  # a probe that did not look
    assert not [f for f in diagnose(ev, None)[1] if f.code == "DDP510"]
    ev = _alone(size=2, collectives=0)  # the group counted nothing, but the probe saw collectives (early post)
    assert not [f for f in diagnose(ev, None)[1] if f.code == "DDP510"]


def test_collective_timeouts_in_torchs_words():
    from ddp_doctor.evidence.torch_errors import collective_timed_out

    assert collective_timed_out("Rank 1 failed to pass monitoredBarrier in 5000 ms")
    assert collective_timed_out("[../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out waiting "
                                "5000ms for recv operation to complete")
    assert collective_timed_out("[Rank 0] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=7, "
                                "OpType=ALLREDUCE) ran for 600000 milliseconds before timing out.")
    assert not collective_timed_out("Connection closed by peer [127.0.0.1]:2967")
    assert not collective_timed_out("CUDA error: an illegal memory access; set a timeout_s option")
    assert not collective_timed_out(None)
