"""One hung job, three views, one finding: ``run``'s probe states, ``attach``'s py-spy samples and a Flight
Recorder dump of the same situation go through their adapters into the one policy (``diagnose/blame.py``)
and must name the same code, culprit rank and line.

Two jobs of tests/scenarios: ``rank0_barrier`` (rank 0 calls ``barrier()`` under ``if rank == 0`` while rank 1
builds the DDP model, whose constructor's collective pairs with nothing: DDP201 on rank 0) and ``op_mismatch``
(rank 0 broadcasts, rank 1 waits in a barrier at the same point: DDP203, every rank).  The three views are real
captures of each: the probe states of ``captures/NAME.json``; the py-spy dumps are those ranks' main-thread
stacks (as ``py-spy dump --json`` prints them: innermost first) sampled three times, unchanged, no CPU or
I/O; the Flight Recorder dumps in ``flight_recorder/NAME`` were written by ``flightrec.write_dump`` in that
scenario run with ``DDP_TIMEOUT=3 TORCH_FR_BUFFER_SIZE=2000`` (paths rewritten to the capture's /checkout,
the launching wrapper's runpy frames dropped)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from ddp_doctor import flightrec
from ddp_doctor.attach.classify import classify
from ddp_doctor.attach.assess import judge_samples as diagnose_attach
from ddp_doctor.attach.discover import RankProcess
from ddp_doctor.attach.sample import SampledRank
from ddp_doctor.attach.pyspy import main_thread, parse_pyspy_json
from ddp_doctor.diagnose import diagnose as diagnose_run
from ddp_doctor.diagnose.blame import blame_calls, odd_ones_out
from ddp_doctor.evidence import Capture, Collective, LintMark, Site

HERE = Path(__file__).parent
# job -> (code, culprit ranks, file name, line) every view must give
JOBS = {"rank0_barrier": ("DDP201", [0], "rank0_barrier.py", 29),
        "op_mismatch": ("DDP203", [0, 1], "op_mismatch.py", 21)}


def _capture(name: str) -> Capture:
    return Capture.from_json(json.loads((HERE / "captures" / f"{name}.json").read_text(encoding="utf-8")))


def _pyspy_dump(stack: tuple[Site, ...], pid: int) -> str:
    """What ``py-spy dump --json --pid PID`` prints for a process whose main thread has ``stack``."""
    frames = [{"name": f.function, "filename": f.path, "line": f.line} for f in reversed(stack)]
    return json.dumps([{"thread_id": 1, "os_thread_id": pid, "thread_name": "MainThread", "active": False,
                        "frames": frames}])


def _attach_views(cap: Capture) -> list[SampledRank]:
    ranks = cap.evidence.ranks
    views = []
    for r, st in sorted(ranks.items()):
        pid = 1000 + r
        samples = [parse_pyspy_json(_pyspy_dump(st.stack, pid), pid) for _ in range(3)]  # 3 looks, 0.5 s apart
        threads = samples[-1]
        mt = main_thread(threads)
        proc = RankProcess(pid, r, r, len(ranks), len(ranks), "job", ["python", "train.py"])
        views.append(SampledRank(proc, classify(mt.frames), mt, threads, unchanged_s=1.0, window_s=1.0, cpu_s=0.0,
                                 moved=False, io_bytes=0))
    return views


def _same(findings) -> tuple:
    errors = [f for f in findings if f.severity.value == "error"]
    assert len(errors) == 1, [(f.code, f.message) for f in findings]
    f = errors[0]
    return f.code, sorted(f.ranks), os.path.basename(f.location.path), f.location.line


@pytest.mark.parametrize("with_lint", [True, False], ids=["lint", "no-lint"])
@pytest.mark.parametrize("job", sorted(JOBS))
def test_run_attach_and_flight_recorder_name_the_same_culprit(job, with_lint):
    cap = _capture(job)
    lint = cap.evidence.lint if with_lint else ()
    evidence = cap.evidence.with_(lint=lint)
    run_verdict, run_findings = diagnose_run(evidence, cap.decision, cap.failures)
    attach_verdict, attach_findings = diagnose_attach(_attach_views(cap), 2, True, lint=lint)
    fr_verdict, fr_findings, _last = flightrec.judge_dumps(flightrec.read_dir(HERE / "flight_recorder" / job), lint=lint)
    assert _same(run_findings) == JOBS[job]
    assert _same(attach_findings) == JOBS[job]
    assert _same(fr_findings) == JOBS[job]
    assert run_verdict == attach_verdict == fr_verdict == "hang"


def test_the_barrier_job_has_lint_on_the_culprits_line():
    assert _capture("rank0_barrier").evidence.lint == (
        LintMark("DDP201", "/checkout/tests/scenarios/rank0_barrier.py", 29),)


def _c(op, line, seq=1, shapes=(), origin="user"):
    return Collective("world", seq, op, shapes, ("float32",) if shapes else (), Site("/job/train.py", line, "main"),
                      origin)


def test_odd_ones_out_is_the_ranks_outside_a_clear_majority():
    calls = {0: _c("all_reduce", 10, shapes=("4",)), 1: _c("all_reduce", 10, shapes=("4",)),
             2: _c("all_reduce", 10, shapes=("8",)), 3: _c("broadcast", 12, shapes=("4",))}
    assert odd_ones_out(calls) == ([2, 3], calls[2].site)
    tie = {0: _c("all_reduce", 10, shapes=("4",)), 1: _c("all_gather_into_tensor", 11, shapes=("4",))}
    assert odd_ones_out(tie) == ([0, 1], tie[0].site)  # no majority: every rank, the lowest rank's line


def test_blame_user_collective_against_ddp_own_and_lint():
    calls = {0: _c("barrier", 29), 1: _c("ddp.backward(allreduce_grads)", 40, origin="ddp"),
             2: _c("ddp.backward(allreduce_grads)", 40, origin="ddp")}
    b = blame_calls(calls)
    assert (b.code, b.ranks, b.site.line, b.lint_seen) == ("DDP201", (0,), 29, False)
    # lint flags a line (same file name, other directory: another node's checkout) -> its code, lint_seen
    lint = (LintMark("DDP201", "/elsewhere/train.py", 12),)
    calls = {0: _c("all_gather", 12, shapes=("[1,1]",)), 1: _c("barrier", 20)}
    b = blame_calls(calls, lint)
    assert (b.code, b.ranks, b.site.line, b.lint_seen) == ("DDP201", (0,), 12, True)
    assert blame_calls(calls).code == "DDP203"


def test_one_policy_asks_the_history_first_where_there_is_one():
    """run's probe states carry each rank's history; the same calls without it are judged by where each stands.
    Rank 0 in a barrier at line 29, rank 1 in DDP's gradient all-reduce: without a history (attach, Flight
    Recorder) the user's collective is the odd one (DDP201); with one where rank 1 ran that barrier line before,
    it is no collective only some ranks call but a mismatch at this position (DDP203, every rank); where rank 1
    never ran it, DDP201 again."""
    from ddp_doctor.evidence import RankState

    calls = {0: _c("barrier", 29), 1: _c("ddp.backward(allreduce_grads)", 40, origin="ddp")}
    assert blame_calls(calls).unpack() == ("DDP201", [0], calls[0].site)
    ran = {r: RankState(rank=r, forwards=3, sites_seen=frozenset({("barrier", calls[0].site.key()),
                                                                  ("ddp.backward(allreduce_grads)", calls[1].site.key())}))
           for r in calls}
    assert blame_calls(calls, ranks=ran).unpack()[:2] == ("DDP203", [0, 1])
    never = {**ran, 1: ran[1].with_(sites_seen=frozenset({("ddp.backward(allreduce_grads)", calls[1].site.key())}))}
    assert blame_calls(calls, ranks=never).unpack() == ("DDP201", [0], calls[0].site)


def test_same_line_is_the_file_name_unless_both_files_are_here_and_differ(tmp_path):
    from ddp_doctor.diagnose.common import same_line

    a, b = tmp_path / "a" / "train.py", tmp_path / "b" / "train.py"
    for p in (a, b):
        p.parent.mkdir()
        p.write_text("x = 1\n")
    assert same_line(str(a), 1, "/another/node/train.py", 1)  # a path from elsewhere: the file name decides
    assert same_line(str(a), 1, str(tmp_path / "a" / ".." / "a" / "train.py"), 1)  # the same file, spelled apart
    assert not same_line(str(a), 1, str(b), 1)  # two files of this machine that happen to share a name
    assert not same_line(str(a), 1, str(a), 2) and not same_line(str(a), 1, "/x/eval.py", 1)


def test_a_diagnosis_that_raises_keeps_the_stacks_in_run_and_attach(monkeypatch):
    """A bug in a diagnosis costs neither source its verdict: run keeps the live decision's, attach the
    samples' (every live rank stuck: hang), both with no finding and the error in words."""
    from ddp_doctor import diagnose as run_core
    from ddp_doctor.attach import assess
    from ddp_doctor.diagnose import core

    def broken(*_a, **_k):
        raise KeyError("site")

    cap = _capture("rank0_barrier")
    monkeypatch.setattr(core, "decided", broken)
    monkeypatch.setattr(assess, "_assess", broken)
    verdict, findings, error = run_core.diagnose_guarded(cap.evidence, cap.decision, cap.failures)
    assert (verdict, findings) == ("hang", []) and error.startswith("KeyError: 'site' at ")
    verdict, findings, error = assess.diagnose_guarded(_attach_views(cap), len(cap.evidence.ranks), True)
    assert (verdict, findings) == ("hang", []) and error.startswith("KeyError: 'site' at ")


# -- the one judge of a stuck job (diagnose/stuck.py): the order of its rules, on typed standings ----------------
class _Source:
    """An EvidenceSource of fixed standings: what run, attach and Flight Recorder each hand the judge."""

    def __init__(self, standings, history=None, lint=()):
        self._st, self._history, self._lint = {s.rank: s for s in standings}, history, lint

    def standings(self):
        return self._st

    def history(self):
        return self._history

    def lint(self):
        return self._lint


def test_the_judge_blames_the_outside_ranks_unless_lint_or_the_history_says_the_waiting_ones_are_alone():
    from ddp_doctor.diagnose.stuck import DATA, PEER, Kind, Standing, judge
    from ddp_doctor.evidence import RankState

    bar = _c("barrier", 29)
    waits, out = Standing(0, bar), Standing(1)
    # no history, no lint (attach, Flight Recorder): the cautious answer, the outside rank stalls
    j = judge(_Source([waits, out]))
    assert (j.kind, j.code, j.ranks) == (Kind.STALL, "DDP205", (1,))
    # lint flags the waiting line as rank-conditional: the waiting rank is alone in it
    j = judge(_Source([waits, out], lint=(LintMark("DDP201", "/job/train.py", 29),)))
    assert (j.kind, j.code, j.ranks, j.site.line, j.lint_seen) == (Kind.SUBSET, "DDP201", (0,), 29, True)
    # the history (run): rank 1 never ran that barrier -> alone; ran it before -> rank 1 did not come back
    never = {0: RankState(rank=0), 1: RankState(rank=1)}
    j = judge(_Source([waits, out], history=never))
    assert (j.kind, j.code, j.ranks, j.lint_seen) == (Kind.SUBSET, "DDP201", (0,), False)
    ran = {**never, 1: RankState(rank=1, sites_seen=frozenset({("barrier", bar.site.key())}))}
    assert judge(_Source([waits, out], history=ran)).kind == Kind.STALL
    # the outside rank waits on its data or on a peer outside the job: it stalls, whatever lint says
    for on in (DATA, PEER):
        j = judge(_Source([waits, Standing(1, waits_on=on)], history=never,
                          lint=(LintMark("DDP201", "/job/train.py", 29),)))
        assert (j.kind, j.ranks) == (Kind.STALL, (1,)), on


def test_the_judge_orders_proof_gone_busy_transport_idle():
    from ddp_doctor.diagnose.stuck import Kind, Standing, judge

    # different collectives at one known position: paired calls that never match, whoever is elsewhere
    j = judge(_Source([Standing(0, _c("barrier", 29, seq=5)), Standing(1, _c("broadcast", 21, seq=5)),
                       Standing(2)]))
    assert (j.kind, j.code, j.ranks) == (Kind.PAIRED, "DDP203", (0, 1))
    # a rank gone while every live one waits in the same collective
    same = [Standing(0, _c("all_reduce", 10)), Standing(1, _c("all_reduce", 10))]
    j = judge(_Source([*same, Standing(2, gone=True)]))
    assert (j.kind, j.code, j.ranks) == (Kind.GONE, "DDP204", (2,))
    # ... and while another still moves: the rank gone is the answer; without it, a moving rank is no hang
    assert judge(_Source([*same, Standing(2, gone=True), Standing(3, moving=True)])).kind == Kind.GONE
    j = judge(_Source([*same, Standing(3, moving=True)]))
    assert (j.kind, j.ranks) == (Kind.BUSY, (3,))
    j = judge(_Source(same))
    assert (j.kind, j.code, j.ranks, j.site.line) == (Kind.TRANSPORT, "DDP205", (0, 1), 10)
    j = judge(_Source([Standing(0), Standing(1)]))
    assert (j.kind, j.code, j.ranks) == (Kind.IDLE, "DDP205", (0, 1))
    assert judge(_Source([Standing(0, gone=True)])).kind == Kind.NONE


def test_a_rank_gone_is_judged_after_the_live_ranks_own_split():
    """A rank gone while the live ranks are split (one outside collectives, or in different collectives): the
    live ranks are judged first, as run and Flight Recorder judge them (gloo aborts a rank on a mismatch)."""
    from ddp_doctor.diagnose.stuck import Kind, Standing, judge

    gone = Standing(2, gone=True)
    assert judge(_Source([Standing(0, _c("barrier", 29)), Standing(1), gone])).kind == Kind.STALL
    j = judge(_Source([Standing(0, _c("barrier", 29)), Standing(1, _c("ddp.backward(allreduce_grads)", 40,
                                                                      origin="ddp")), gone]))
    assert (j.kind, j.code, j.ranks) == (Kind.PAIRED, "DDP201", (0,))
