"""Parity by construction: one set of real 2-rank gloo jobs, each looked at three ways, must give one finding.

The jobs are ``manifest.PARITY`` of tests/scenarios: a rank-0 barrier, a mismatched collective (rank 0
broadcasts, rank 1 waits in a barrier), a rank that died (SIGKILL), a rank stalled outside any collective (a
read that never returns), and a clean twin.  Each runs twice, concurrently with the others, in this module's
one fixture:

- under ``ddp-doctor run`` (the watcher's report; checked against scenarios.json like every other scenario);
- under plain torchrun with Flight Recorder on (``TORCH_FR_BUFFER_SIZE``; ``fr_dump_on_error.py`` writes
  each rank's dump as it ends), where ``ddp-doctor attach`` looks at the live job while it hangs (the jobs that
  end by themselves -- the dead rank, the clean twin -- cannot be attached to), then the process group's
  timeout ends it and ``ddp-doctor report --flight-recorder`` reads the dumps.

Every view of a job must name the same code, culprit ranks and line (the ``# expect:`` marker of the script),
and the clean twin must be clean in every view.  Nothing here knows which module of ddp_doctor decides:
the views are the three commands a user runs.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SRC = ROOT / "src"
sys.path.insert(0, str(ROOT / "tests" / "scenarios"))
sys.path.append(str(ROOT / "tests" / "launchers"))
import manifest  # noqa: E402 (tests/scenarios, put on the path above)
from launch_helpers import free_port, kill_tree, rank_env  # noqa: E402 (the one port picker, tree kill, env)

from ddp_doctor.cli.report import validate  # noqa: E402

pytestmark = [pytest.mark.scenario, pytest.mark.timeout(900)]

# The jobs a live attach can look at: they hang until the process group's timeout.  The others end by
# themselves within seconds (a rank killed, a clean job), before any attach could be sure of anything.
ATTACHABLE = {"rank0_barrier", "op_mismatch", "stuck_read_rank1"}
# The process group's timeout of the Flight Recorder runs: long enough for attach to look at the hung job a few
# times on a loaded machine (each look starts a Python and py-spy), short enough to end it soon after.  (A
# watchdog thread in the rank, asked to dump earlier, never wrote the dump of a rank waiting in gloo's barrier.)
FR_PG_TIMEOUT_S = 40
# attach looks again until it sees the hang: the ranks may still be starting (torch's import on a loaded box) or
# settling into it; the job ends by itself at the process group's timeout, this is only a bound
ATTACH_LOOK_S = 240
PARALLEL = int(os.environ.get("DDP_DOCTOR_TEST_PARALLEL", "5"))  # half the launches mostly wait: 5 at a time


@dataclass
class Views:
    """One job's three reports (None: that view is not possible for this job) and what the runs printed."""

    run: dict | None
    run_res: manifest.CommandResult
    attach: dict | None
    attach_log: list[str] = field(default_factory=list)
    flightrec: dict | None = None
    dumps: list[str] = field(default_factory=list)
    job_log: str = ""


def _doctor(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``ddp-doctor ARGS`` of this checkout."""
    return subprocess.run([sys.executable, "-m", "ddp_doctor", *args], env=rank_env(), capture_output=True,
                          text=True, timeout=timeout)


def _tree(proc: subprocess.Popen) -> dict[int, str]:
    """{pid: status} of the launcher and everything under it."""
    import psutil

    out = {}
    try:
        root = psutil.Process(proc.pid)
        procs = [root] + root.children(recursive=True)
    except psutil.Error:
        return out
    for p in procs:
        try:
            out[p.pid] = p.status()
        except psutil.Error:
            pass
    return out


def _attach_until_stuck(proc: subprocess.Popen, out: Path, log: list[str]) -> dict | None:
    """Attach to the launcher of the live job until it is seen stuck; the last report (None if the job ended
    first).  Each look must leave the job exactly as it was: attach never stops or loses a process."""
    deadline = time.monotonic() + ATTACH_LOOK_S
    rep = None
    while proc.poll() is None and time.monotonic() < deadline:
        before = _tree(proc)
        p = _doctor("attach", str(proc.pid), "--report", str(out), "--samples", "3", "--interval", "0.5")
        log.append(f"rc {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-2000:]}")
        if p.returncode in (0, 1):
            after = _tree(proc)
            assert set(before) <= set(after), (before, after)  # no process killed or lost (ranks may start)
            assert all(st != "stopped" for st in after.values()), after  # and none left paused
            rep = json.loads(out.read_text())
            rep["_stdout"] = p.stdout
            if rep["verdict"] != "ok":
                return rep
        else:  # only while the ranks are starting: no training process yet
            assert "no training process found" in p.stderr, p.stderr
        time.sleep(0.5)
    return rep


def _watched(name: str, tmp: Path) -> tuple[dict | None, list[str], dict | None, list[str], str]:
    """Plain torchrun with Flight Recorder on: attach while it hangs, then the dumps' report."""
    fr = tmp / "fr"
    fr.mkdir()
    log = tmp / "job.log"
    env = manifest.scenario_env(name, rank_env(TORCH_FR_BUFFER_SIZE="2000", DDP_TIMEOUT=str(FR_PG_TIMEOUT_S),
                                               TORCH_FR_DUMP_TEMP_FILE=str(fr / "fr_rank_")))
    argv = manifest.torchrun_argv(name, endpoint=f"127.0.0.1:{free_port()}")
    script = argv.index(str(manifest.script_path(name)))
    cmd = [sys.executable, "-m", "torch.distributed.run", *argv[:script], str(HERE / "fr_dump_on_error.py"),
           *argv[script:]]
    with open(log, "w") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=tmp, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    attach_log: list[str] = []
    try:
        attach = _attach_until_stuck(proc, tmp / "attach.json", attach_log) if name in ATTACHABLE else None
        proc.wait(timeout=FR_PG_TIMEOUT_S + 120)
    finally:
        kill_tree(proc)
    dumps = sorted(p.name for p in fr.iterdir())
    flightrec = None
    if dumps:
        p = _doctor("report", "--flight-recorder", str(fr), "-o", str(tmp / "fr.json"), "--html",
                    str(tmp / "fr.html"), "--color", "never")
        assert p.returncode == 0, p.stderr
        flightrec = json.loads((tmp / "fr.json").read_text())
        flightrec["_stdout"], flightrec["_html"] = p.stdout, (tmp / "fr.html").read_text()
    return attach, attach_log, flightrec, dumps, log.read_text(errors="replace")


def _run(name: str, tmp: Path) -> tuple[manifest.CommandResult, dict | None]:
    run_json = tmp / "run.json"
    res = manifest.doctor_run(name, run_json, env=rank_env())
    return res, (json.loads(run_json.read_text()) if run_json.exists() else None)


@pytest.fixture(scope="module")
def views(tmp_path_factory) -> dict[str, Views]:
    """Every parity job, run once each way (a few launches at a time; the watched ones, which wait, first)."""
    tmp = {n: tmp_path_factory.mktemp(n) for n in manifest.PARITY}
    with ThreadPoolExecutor(PARALLEL) as pool:
        watched = {n: pool.submit(_watched, n, tmp[n]) for n in manifest.PARITY}
        runs = {n: pool.submit(_run, n, tmp[n]) for n in manifest.PARITY}
        return {n: Views(*runs[n].result()[::-1], *watched[n].result()) for n in manifest.PARITY}


def _culprit(rep: dict) -> tuple | None:
    """(code, culprit ranks, file name, line) of the report's first error finding; None if it has none."""
    errors = [f for f in rep["findings"] if f["severity"] == "error"]
    if not errors:
        return None
    f = errors[0]
    loc = f.get("location") or {}
    return f["code"], sorted(f["ranks"]), Path(loc.get("path") or "").name, loc.get("line")


def _expected(name: str) -> tuple | None:
    """What scenarios.json says every view must name: (code, ranks, file, marker line or None)."""
    want = manifest.entry(name)["expect"]["findings"]
    if not want:
        return None
    w = want[0]
    line = manifest.marker_line(name, w["code"]) if w.get("marker") else None
    return w["code"], sorted(w["ranks"]), manifest.script_path(name).name, line


def _views_of(v: Views) -> dict[str, dict]:
    return {k: rep for k, rep in (("run", v.run), ("attach", v.attach), ("flight recorder", v.flightrec))
            if rep is not None}


@pytest.mark.parametrize("name", manifest.PARITY)
def test_run_report(views, name):
    """The watcher's report of the job: scenarios.json's expectation, as for every other scenario."""
    manifest.assert_run_report(name, views[name].run_res, views[name].run)


def _line_known(what: str, code: str) -> bool:
    """Whether the view can know the culprit's line: Flight Recorder records collectives only, so for a rank
    that stalled outside them (DDP205) it names the rank and the last collective it recorded, not the line
    where it stalled (the probe's and py-spy's stacks show that line)."""
    return not (what == "flight recorder" and code == "DDP205")


@pytest.mark.parametrize("name", manifest.PARITY)
def test_every_view_names_the_same_finding(views, name):
    v = views[name]
    reps = _views_of(v)
    for what, rep in reps.items():
        assert validate({k: x for k, x in rep.items() if not k.startswith("_")}) == [], what  # report/v1
    if name in ATTACHABLE:
        assert v.attach is not None, ("attach saw no live job", v.attach_log[-3:], v.job_log[-3000:])
    assert v.flightrec is not None, ("no Flight Recorder dump", v.job_log[-3000:])
    expected = _expected(name)
    got = {what: _culprit(rep) for what, rep in reps.items()}
    if expected is None:  # the clean twin: clean whoever looked
        assert got == {what: None for what in reps}, got
        assert {rep["verdict"] for rep in reps.values()} == {"ok"}, {w: r["verdict"] for w, r in reps.items()}
        assert v.dumps == ["fr_rank_0", "fr_rank_1"], v.job_log[-3000:]
        return
    code, ranks, file, line = expected  # line None: the scenario has no line to name (a rank killed anywhere)
    for what, c in got.items():
        assert c is not None, (what, reps[what]["verdict"], reps[what]["findings"], v.attach_log[-2:])
        assert c[:3] == (code, ranks, file), (what, got, expected)
        if line is not None and _line_known(what, code):
            assert c[3] == line, (what, got, expected)
    for what in ("attach", "flight recorder"):  # what each command printed names it too
        if what in reps:
            assert code in reps[what]["_stdout"], what
            if line is not None and _line_known(what, code):
                assert f"{file}:{line}" in reps[what]["_stdout"], what
    assert code in v.flightrec["_html"]


def test_run_ends_with_the_killed_ranks_status(views):
    """``ddp-doctor run`` exits as the killed rank did (128 + SIGKILL), names SIGKILL and the OOM killer."""
    v = views["rank_sigkill"]
    assert v.run_res.returncode == 137 == v.run["exit_code"], (v.run_res.returncode, v.run_res.stderr[-2000:])
    f = next(f for f in v.run["findings"] if f["code"] == "DDP204")
    assert "SIGKILL" in f["message"] and "out-of-memory killer" in f["message"], f["message"]


def test_flight_recorder_without_a_dead_ranks_dump_names_it(views):
    """A killed rank writes no dump: the survivor's dump alone names it (DDP204) and says what the survivor
    last recorded, at its line."""
    v = views["rank_sigkill"]
    assert v.dumps == ["fr_rank_0"], v.job_log[-3000:]
    f = next(f for f in v.flightrec["findings"] if f["code"] == "DDP204")
    assert f["ranks"] == [1] and "Rank 1 wrote no Flight Recorder dump" in f["message"]
    assert "all_reduce [610] Float" in f["message"] and f"rank_sigkill.py:{f['location']['line']}" in f["message"]


def test_flight_recorder_names_where_a_stalled_rank_stopped_recording(views):
    """A rank stalled outside collectives: its dump stops one collective short of the others', and the finding
    says so (the line of its last recorded collective, not a line it cannot know)."""
    f = _culprit(views["stuck_read_rank1"].flightrec)
    msg = views["stuck_read_rank1"].flightrec["findings"][0]["message"]
    assert f[:2] == ("DDP205", [1]) and "stalled outside collectives after that line" in msg, msg
    assert f"stuck_read_rank1.py:{f[3]}" in msg


def test_attach_names_what_the_other_ranks_wait_in(views):
    """attach's stall finding says where the ranks that wait are (the probe's and py-spy's stacks agree)."""
    f = next(f for f in views["stuck_read_rank1"].attach["findings"] if f["severity"] == "error")
    assert "rank 0 waits in ddp.backward(allreduce_grads)" in f["message"], f["message"]


def test_flight_recorder_shows_each_ranks_call(views):
    """The dumps' finding carries what each rank recorded at the collective where they parted: rank 0's
    barrier against rank 1's first collective in DDP's constructor; rank 0's broadcast against rank 1's
    barrier."""
    def ops(name: str) -> dict[str, str]:
        f = next(f for f in views[name].flightrec["findings"] if f["severity"] == "error")
        return {r: c["op"] for r, c in f["evidence"]["calls"].items()}

    barrier = ops("rank0_barrier")
    assert barrier["0"] == "barrier" and barrier["1"] != "barrier", barrier
    assert sorted(ops("op_mismatch").values()) == ["barrier", "broadcast"], ops("op_mismatch")
