"""Flight Recorder dumps -> ddp-doctor's diagnosis (culprit rank, op/shape, user line).

A rank-0 barrier, a mismatched collective, a rank that died and a stalled rank are read from the dumps of the
parity jobs (tests/parity: the same jobs under run and attach, which must name the same finding); this module
adds a real job whose ranks' shapes differ (gloo pairs them silently) and dumps written by hand."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from ddp_doctor import flightrec

pytestmark = pytest.mark.scenario
HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"
JOB = HERE / "scripts" / "fr_job.py"


def _line(marker: str) -> int:
    return next(i for i, s in enumerate(JOB.read_text().splitlines(), 1) if s.rstrip().endswith(f"# expect: {marker}"))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_broadcast_size_mismatch_from_dumps(tmp_path):
    d = tmp_path / "dumps"
    d.mkdir()
    env = dict(os.environ, PYTHONPATH=str(SRC), TORCH_FR_BUFFER_SIZE="2000",
               TORCH_FR_DUMP_TEMP_FILE=str(d / "fr_rank_"), OMP_NUM_THREADS="1")
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-endpoint",
                        f"127.0.0.1:{_port()}", str(JOB)], env=env, capture_output=True, text=True, timeout=180)
    log = p.stdout + p.stderr
    assert sorted(x.name for x in d.iterdir()) == ["fr_rank_0", "fr_rank_1"], log[-2000:]
    rep, text = _report(d, tmp_path)
    assert rep["source"] == "flight_recorder"
    f = rep["findings"][0]
    assert f["code"] == "DDP203" and f["location"]["line"] == _line("broadcast_size")
    assert "shapes" in f["message"]
    assert f["evidence"]["calls"]["0"]["shape"] == [4] and f["evidence"]["calls"]["1"]["shape"] == [8]
    assert rep["verdict"] == "desync"  # gloo paired them silently; both ranks went on to the barrier
    assert "DDP203" in text and f"fr_job.py:{_line('broadcast_size')}" in text
    assert "DDP203" in (tmp_path / "fr.html").read_text()


def _report(d: Path, tmp_path: Path) -> tuple[dict, str]:
    out = tmp_path / "fr.json"
    p = subprocess.run([sys.executable, "-m", "ddp_doctor", "report", "--flight-recorder", str(d), "-o", str(out),
                        "--html", str(tmp_path / "fr.html"), "--color", "never"],
                       env=dict(os.environ, PYTHONPATH=str(SRC)), capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    rep = json.loads(out.read_text())
    from ddp_doctor.cli.report import validate

    assert validate(rep) == []  # the report/v1 contract
    return rep, p.stdout


def _entry(seq, op, line, sizes=((4,),), frames_path="/job/train.py"):
    return {"process_group": ("0", "default_pg"), "collective_seq_id": seq, "p2p_seq_id": 0, "is_p2p": False,
            "profiling_name": f"nccl:{op}", "input_sizes": [list(s) for s in sizes], "input_dtypes": ["Float"],
            "output_sizes": [], "state": "completed",
            "frames": [{"name": op, "filename": "/x/torch/distributed/distributed_c10d.py", "line": 1},
                       {"name": "main", "filename": frames_path, "line": line}]}


def test_rank_behind_and_json_dumps(tmp_path):
    """A rank that never reached collective #3 (NCCL-named JSON dumps, as _dump_fr_trace_json writes them)."""
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
    for r in range(3):
        entries = [_entry(seq, "all_reduce", 10) for seq in (1, 2, 3) if not (r == 2 and seq == 3)]
        dump = {"version": "2.10", "pg_config": cfg, "entries": entries}
        (tmp_path / f"nccl_trace_rank_{r}").write_text(json.dumps(dump))
    verdict, findings, last = flightrec.judge_dumps(flightrec.read_dir(tmp_path))
    assert verdict == "hang"
    assert [(f.code, f.ranks) for f in findings] == [("DDP205", [2])]
    assert "never reached collective #3" in findings[0].message


def test_empty_dir_is_a_clear_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(flightrec.FlightRecorderError, match="no Flight Recorder dump"):
        flightrec.read_dir(tmp_path)


def test_per_rank_split_sizes_are_no_mismatch_but_other_sizes_are(tmp_path):
    """Flight Recorder entries are judged by the live watcher's rule (``Collective.must_agree``): an all_to_all
    with per-rank split sizes agrees (torch allows it), an all_reduce of other sizes does not."""
    cfg = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}}
    for r in range(2):
        entries = [_entry(1, "all_to_all_single", 10, sizes=((5 + r, 8),)), _entry(2, "all_reduce", 11)]
        (tmp_path / f"nccl_trace_rank_{r}").write_text(json.dumps({"version": "2.10", "pg_config": cfg,
                                                                    "entries": entries}))
    verdict, findings, _ = flightrec.judge_dumps(flightrec.read_dir(tmp_path))
    assert verdict == "ok" and findings == []
    bad = tmp_path / "bad"
    bad.mkdir()
    for r in range(2):
        entries = [_entry(1, "all_reduce", 10, sizes=((4 + r,),))]
        (bad / f"nccl_trace_rank_{r}").write_text(json.dumps({"version": "2.10", "pg_config": cfg, "entries": entries}))
    verdict, findings, _ = flightrec.judge_dumps(flightrec.read_dir(bad))
    assert findings and findings[0].code == "DDP203"
