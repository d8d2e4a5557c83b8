"""The session's report assembly on typed evidence: no processes."""
from __future__ import annotations

from types import SimpleNamespace

from ddp_doctor.evidence import Collective, ExitStatus, JobEvidence, RaisedError, RankState, Site, Timing
from ddp_doctor.diagnose.blame import lint_mark
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.diagnose.wording import decided
from ddp_doctor.findings import Finding, Location
from ddp_doctor.session.assemble import confirm_lint, crash_exit_code, live_rows, state_entry as rank_entry
from ddp_doctor.watcher.views import RankView

S = Site("/u/train.py", 20, "main")


def test_rank_entry_states_and_fields():
    waiting = RankState(rank=0, step=4, in_collective=Collective("world", 9, "barrier", site=S, waiting_s=2.0))
    e = rank_entry(0, waiting, {})
    assert e["state"] == "in_collective" and e["last_collective"]["op"] == "barrier" and e["step"] == 4
    crashed = RankState(rank=1, exc=RaisedError("ValueError", "x", location=S, traceback=(S,)))
    e = rank_entry(1, crashed, {1: ExitStatus(1, None)})
    assert e["state"] == "crashed" and e["stack"] == [S.to_json()] and e["exit_code"] == 1
    assert rank_entry(2, RankState(rank=2), {2: ExitStatus(-9, "SIGKILL")})["state"] == "killed"
    assert rank_entry(3, RankState(rank=3, missing=True), {}) == {
        "rank": 3, "state": "missing", "epoch": None, "step": None, "last_collective": None, "stack": [],
        "exit_code": None, "signal": None}


def _confirmed(runtime: Draft, lint: list[Finding]) -> tuple[dict, list[dict]]:
    """The runtime finding worded with lint's marks, and lint's report dicts after the report confirms them."""
    [f] = decided([runtime], {}, tuple(lint_mark(x) for x in lint))
    out, lint_dicts = f.to_report_dict(), [x.to_report_dict() for x in lint]
    confirm_lint([out], lint_dicts)
    return out, lint_dicts


def test_runtime_finding_confirms_lint_on_the_same_line_and_hazard():
    runtime, lint = _confirmed(Draft("DDP202", "m", "f", location=Location("/node1/train.py", 20)),
                               [Finding("DDP201", "lm", "lf", location=Location("train.py", 20)),
                                Finding("DDP401", "lm", "lf", location=Location("train.py", 20))])
    assert lint[0]["confirmed_by_runtime"] == "DDP202" and lint[0]["severity"] == "error"
    assert "confirmed_by_runtime" not in lint[1]
    assert runtime["evidence"]["lint"]["code"] == "DDP201" and runtime["evidence"]["lint"]["message"] == "lm"
    assert runtime["message"] == ("m ddp-doctor lint flagged this line before the run (DDP201): the static warning "
                                  "came true.")


def test_advice_seen_happen_stays_advice():
    """Workers restarted each epoch, seen by lint and measured at run time: still advice, not an error."""
    runtime, lint = _confirmed(Draft("DDP403", "m", "f", location=Location("/x/train.py", 35)),
                               [Finding("DDP403", "lm", "lf", location=Location("train.py", 35))])
    assert runtime["severity"] == "info"
    assert lint[0]["confirmed_by_runtime"] == "DDP403" and lint[0]["severity"] == "info"


def test_live_rows_from_typed_states():
    v0 = RankView(0)
    v0.update(RankState(rank=0, step=3, step_times=(0.1, 0.2), timing=Timing(3, 0.3, 0.3, 0.1, 0, 0.2),
                        in_collective=Collective("world", 4, "barrier", site=S)), 1.0)
    rows = live_rows(SimpleNamespace(views={0: v0, 1: RankView(1)}))
    assert rows[0]["state"] == "in barrier" and rows[0]["where"] == "train.py:20" and rows[0]["data_wait_pct"] == 33.3
    assert rows[1]["state"] == "starting"


def test_the_exit_code_is_the_programs_own_even_when_torch_aborts_at_teardown():
    """Every rank called sys.exit(3); gloo then aborted rank 1 while the group was torn down (SIGABRT).
    The job's code is the 3 the program chose (schedulers requeue on it), not 134."""
    ranks = {0: RankState(rank=0, exit_code=3), 1: RankState(rank=1, exit_code=3)}
    job = SimpleNamespace(failures={0: ExitStatus(3, None), 1: ExitStatus(-6, "SIGABRT")})
    root = Finding("DDP204", "rank 1", "", location=Location("/u/train.py", 1), ranks=[1])
    assert crash_exit_code(job, JobEvidence(world_size=2, ranks=ranks), [root]) == 3
    # a rank killed before its program ended (no code of its own): the signal, as a shell shows it
    ranks[1] = RankState(rank=1)
    job.failures[1] = ExitStatus(-9, "SIGKILL")
    assert crash_exit_code(job, JobEvidence(world_size=2, ranks=ranks), [root]) == 137


def test_launcher_names_the_framework_under_accelerate_launch_and_fabric_alone(monkeypatch):
    """The report's `launcher` from rank 0's environment and modules: the HF Trainer under `accelerate launch`
    is named with it (accelerate's own scripts are not "accelerate launch (accelerate)"); a script on the
    standalone `lightning_fabric` package started as `python train.py` is Lightning's subprocess launch."""
    import sys

    from ddp_doctor.session import launcher

    for name in ("lightning", "pytorch_lightning", "lightning_fabric", "accelerate", "transformers",
                 "transformers.trainer", "ray.train"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    for var in ("TORCHELASTIC_RUN_ID", "ACCELERATE_MIXED_PRECISION", "ACCELERATE_DYNAMO_BACKEND", "NPROC",
                "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setitem(sys.modules, "lightning_fabric", SimpleNamespace())
    assert launcher.detect() == "lightning (subprocess)"
    monkeypatch.delitem(sys.modules, "lightning_fabric")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "no")
    monkeypatch.setitem(sys.modules, "accelerate", SimpleNamespace())
    assert launcher.detect() == "accelerate launch"
    monkeypatch.setitem(sys.modules, "transformers", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "transformers.trainer", SimpleNamespace())
    assert launcher.detect() == "accelerate launch (transformers Trainer)"
