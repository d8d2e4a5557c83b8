"""The typed evidence model is the wire format: what the probe writes reads back equal, field by field."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_doctor.evidence import (SCHEMA, Activity, Capture, Collective, DataWait, DdpModel, DdpParam, ExitStatus,
                                 GroupInit, JobEvidence, LintMark, LoaderState, Microbatches, RaisedError, RankState,
                                 Refused,
                                 SamplerState,
                                 Site, SiteCount, Suspicion, ThreadStack, TimelineEvent, Timing, Verdict, WorkerExit,
                                 WorkerStack, rank_state_from_wire, to_wire)
from ddp_doctor.report._view import collective_text

ROOT = Path(__file__).resolve().parents[2]
CAPTURES = sorted((ROOT / "tests" / "golden" / "captures").glob("*.json"))
S = Site("/u/train.py", 20, "main")


def _full_state() -> RankState:
    c = Collective("world", 7, "all_gather", ("10x3", "10x3"), ("float32",), S, "user", 1.5, blocking=True)
    return RankState(
        rank=1, local_rank=1, host="h", pid=42, attempt=1, agent_store=True, world_size=2,
        group=GroupInit(1, 0, S, "gloo", 40), t=3.0, epoch=0, step=5,
        step_in_epoch=5, forwards=6, backwards=5, progress=17, steps_by_epoch=(5,), train_loader=0,
        step_times=(0.1, 0.2), cpu_s=1.0, activity=Activity(0.5, 4096, 1.25, 12345), pg_timeout_s=90.0, where=S,
        in_collective=c, last_collective=c.__class__("world", 6, "barrier"),
        in_data_wait=DataWait(0, 0.5), seq={"world": 8},
        fingerprints=(Collective("world", 6, "barrier", site=Site("/u/train.py", 19, "main"), epoch=0, step_in_epoch=4),
                      Collective("world", 7, "all_gather", ("10x3",), ("float32",), S, epoch=0, step_in_epoch=5,
                                 join=True)),
        site_counts=(SiteCount("all_gather", S, 3), SiteCount("barrier", None, 1)),
        not_member=(SiteCount("all_reduce", S, 2),),
        microbatches=(Microbatches(S, 4),),
        timing=Timing(5, 1.0, 1.0, 0.2, 0.1, 0.7), coll_count=9, coll_time_s=0.1,
        loaders=(LoaderState(S, 8, 2, True, False, 2, 32, 1, 5, 0.2, (0.05,), (0.01,), (5,), (5,), (0,),
                             SamplerState("DistributedSampler", 0, True, False, 8, 0, (0, 0)), (77, 78),
                             join_epochs=(0,), skipped_batches=((0, 3),), worker_exits=(WorkerExit(78, -9, "SIGKILL"),)),),
        ddp=(DdpModel(S, True, True, 2, 4, False, 0, (DdpParam(2, "head.weight", "Linear"), DdpParam(3, "bias"))),),
        exc=RaisedError("RuntimeError", "boom", "builtins", S, (Site("/u/train.py", 30, "<module>"), S), True, c, 2.0),
        done=False, teardown=True, exit_code=1, exit_site=None, timeline=(TimelineEvent(0.1, "step", 0.2, "step 2"),),
        perf={"loadavg": [1.0, 1.0, 1.0], "cpu_count": 8},
        refused=(Refused("ddpd/stop", "bad signature", 2), Refused("ddpd/stop", "unsigned", 1)),
        stack=(S,), threads=(ThreadStack("MainThread", True, (S,)),), workers=(WorkerStack(77, (S,)),),
        exit=ExitStatus(-9, "SIGKILL"), busy=True, stalled_s=3.5, idle_s=3.0,
        sites_seen=frozenset({("all_gather", S.key()), ("barrier", None)}), fatal_stack=True)


def test_every_field_round_trips_through_the_wire_text():
    st = _full_state()
    back = rank_state_from_wire(to_wire(st))
    assert back == st
    warn = Suspicion(12.5, {1: st.in_collective}, {0: S}, {0: 12.0, 1: 0.5}, 90.0)
    ev = JobEvidence(2, {1: st, 0: RankState(rank=0, missing=True)}, 1.0, 5.0, "adaptive",
                     (LintMark("DDP201", "/u/train.py", 20),), warn)
    assert JobEvidence.from_json(json.loads(json.dumps(ev.to_json()))) == ev
    v = Verdict("desync", kind="shape", group="world", seq=7, calls={0: st.in_collective, 1: st.in_collective},
                busy=(1,), failed=False, blocked=True, t_detect=1.0, t_stacks=2.0)
    assert Verdict.from_json(json.loads(json.dumps(v.to_json()))) == v
    cap = Capture(ev, v, {1: ExitStatus(-9, "SIGKILL")})
    assert Capture.from_json(json.loads(json.dumps(cap.to_json()))) == cap


def test_text_of_another_schema_is_not_misread():
    assert rank_state_from_wire(json.dumps({"rank": 0, "step": 3})) is None
    assert rank_state_from_wire("not json") is None


def test_report_shows_a_collectives_shapes_and_dtypes():
    """The report renders what the probe publishes (it once read `shape`/`dtype` and showed nothing)."""
    text = collective_text(_full_state().in_collective.to_json())
    assert "all_gather #7" in text and "shapes=10x3, 10x3" in text and "dtypes=float32" in text


@pytest.mark.parametrize("path", CAPTURES, ids=lambda p: p.stem)
def test_captured_evidence_of_real_runs_round_trips(path):
    """Evidence saved from real `ddp-doctor run` jobs (tests/golden/capture.py) decodes and re-encodes exactly."""
    data = json.loads(path.read_text(encoding="utf-8"))
    cap = Capture.from_json(data)
    assert json.loads(json.dumps(cap.to_json(), default=str)) == data
    for r, st in cap.evidence.ranks.items():
        assert st.rank == r and (st.missing or st.host)


@pytest.mark.scenario
def test_live_probe_output_round_trips(tmp_path):
    """A real 2-rank gloo job: each rank's published state decodes to the records it was built from."""
    env = dict(os.environ, PYTHONPATH=str(ROOT / "src"), OUT_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    app = Path(__file__).with_name("probe_app.py")
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           str(app)], env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(i for i, t in enumerate(app.read_text().splitlines(), 1) if "GATHER_LINE" in t)
    for r in (0, 1):
        raw = (tmp_path / f"rank{r}.json").read_text()
        assert json.loads(raw)["schema"] == SCHEMA
        st = rank_state_from_wire(raw)
        assert st.rank == r and st.world_size == 2 and st.step == 3
        assert json.loads(to_wire(st)) == json.loads(raw)  # decode -> encode is the identity on real output
        gather = [c for c in st.fingerprints if c.op == "all_gather"]
        # the output list, then the input tensor
        assert len(gather) == 1 and gather[0].shapes == ("[2x3,2x3]", "2x3") and gather[0].dtypes == ("float64",) * 2
        assert gather[0].site.line == line and gather[0].site.path.endswith("probe_app.py")
        assert any(c.op == "ddp.backward(allreduce_grads)" for c in st.fingerprints)
        assert st.last_collective.op == "all_gather" and st.last_collective.waiting_s is None
        assert st.loaders == () and st.ddp[0].params == 2 and st.timeline
        assert "shapes=[2x3,2x3], 2x3" in collective_text(st.last_collective.to_json())
