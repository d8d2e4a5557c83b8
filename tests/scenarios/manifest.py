"""The scenario library: what each training script in this folder does and what ddp-doctor must say about it.

``scenarios.json`` (beside this file) holds one entry per script; this module is
the only code that reads it.  Typical use from another test::

    from tests.scenarios import manifest            # or: import manifest (sys.path)
    argv = manifest.torchrun_argv("rank0_barrier")   # options + script + args
    res = manifest.run_command([sys.executable, "-m", "ddp_doctor", "run",
                                "--report", str(out), *argv], timeout=120)
    assert not manifest.report_problems("rank0_barrier", json.loads(out.read_text()))
    manifest.assert_no_leftovers(res.pgid)

It also works as a small command-line tool::

    python tests/scenarios/manifest.py list [--issue run|perf]
    python tests/scenarios/manifest.py observe NAME... [--timeout S]   # plain torchrun, print what happens
    PYTHONPATH=src python tests/scenarios/manifest.py doctor [NAME...|--issue run]  # ddp-doctor run vs expectations

Only the standard library is needed at import time; ``psutil`` is imported when
leftovers are checked.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

HERE = Path(__file__).resolve().parent
MANIFEST_JSON = HERE / "scenarios.json"
VERDICTS = ("ok", "hang", "crash", "desync")
DEFAULT_PG_TIMEOUT_S = 90.0  # every script: init_process_group(timeout=DDP_TIMEOUT env, default 90 s)
_MARKER = re.compile(r"#\s*expect:\s*((?:DDP\d{3}[\s,]*)+)")


@lru_cache(maxsize=1)
def _load() -> dict[str, dict[str, Any]]:
    data = json.loads(MANIFEST_JSON.read_text())
    entries = data["scenarios"] if isinstance(data, dict) else data
    out: dict[str, dict[str, Any]] = {}
    for entry in entries:
        name = Path(entry["script"]).stem
        if name in out:
            raise ValueError(f"duplicate scenario {name!r} in {MANIFEST_JSON}")
        out[name] = entry
    return out


# The scenarios tests/parity runs once and looks at three ways (``ddp-doctor run``, ``ddp-doctor attach`` on the
# live job, its Flight Recorder dumps): a rank-0 barrier, a mismatched collective, a rank that died, a stalled
# rank, a clean twin.  tests/run/test_scenarios_run.py leaves them to it (one run of each, not two).
PARITY = ("rank0_barrier", "op_mismatch", "rank_sigkill", "stuck_read_rank1", "rank0_print_save")


def names(issue: str | None = None) -> list[str]:
    """Scenario names (script stems), optionally only those of issue ``"run"`` or ``"perf"``."""
    return [n for n, e in _load().items() if issue is None or e.get("issue") == issue]


def entry(name: str) -> dict[str, Any]:
    """The raw scenarios.json entry of ``name``."""
    try:
        return _load()[name]
    except KeyError:
        raise KeyError(f"unknown scenario {name!r}; known: {', '.join(sorted(_load()))}") from None


def is_twin(name: str) -> bool:
    """True for the clean twins (expected verdict ok and no error finding)."""
    return bool(entry(name).get("twin_of"))


def script_path(name: str) -> Path:
    """Absolute path of the scenario's training script."""
    return HERE / entry(name)["script"]


def marker_lines(name: str, code: str) -> list[int]:
    """Every 1-based line of the script carrying ``# expect: CODE`` (a line may name several codes)."""
    lines = []
    for no, text in enumerate(script_path(name).read_text().splitlines(), start=1):
        m = _MARKER.search(text)
        if m and code in re.findall(r"DDP\d{3}", m.group(1)):
            lines.append(no)
    return lines


def marker_line(name: str, code: str) -> int:
    """The (first) line of the script marked ``# expect: CODE``; KeyError if there is none."""
    lines = marker_lines(name, code)
    if not lines:
        raise KeyError(f"{script_path(name).name} has no '# expect: {code}' marker")
    return lines[0]


def torchrun_argv(name: str, endpoint: str = "127.0.0.1:0", nnodes: int = 1, node_rank: int = 0,
                  rdzv_id: str | None = None) -> list[str]:
    """torchrun options + script + args (no launcher prefix).

    Works both as ``python -m torch.distributed.run <argv>`` and ``ddp-doctor run <argv>``.
    For a two-"node" job on this machine call it once per node with ``nnodes=2``,
    ``node_rank=0/1``, the same fixed ``endpoint`` (e.g. ``127.0.0.1:30123``) and the same
    ``rdzv_id``; each node then runs ``nproc // nnodes`` ranks, so the world size (and the
    global ranks in the expectation) stay the same.
    """
    e = entry(name)
    nproc = int(e.get("nproc", 2))
    opts = ["--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint]
    if nnodes > 1:
        if endpoint.endswith(":0"):
            raise ValueError("a multi-node job needs a fixed rendezvous port")
        if nproc % nnodes:
            raise ValueError(f"{name}: nproc {nproc} is not divisible by nnodes {nnodes}")
        opts += ["--nnodes", str(nnodes), "--node-rank", str(node_rank), "--rdzv-id", rdzv_id or f"scenario-{name}"]
        nproc //= nnodes
    return ["--nproc-per-node", str(nproc), *opts, str(script_path(name)), *[str(a) for a in e.get("args", [])]]


def doctor_options(name: str) -> list[str]:
    """``ddp-doctor run`` options the entry asks for ("doctor"), e.g. ``--hang-timeout 10`` for a scenario
    whose hang is caught by the no-progress limit (a user waiting for a verdict sooner than the default)."""
    return [str(a) for a in entry(name).get("doctor", [])]


def scenario_env(name: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment to run ``name`` with: ``base`` (default os.environ) plus the entry's "env"."""
    env = dict(os.environ if base is None else base)
    env.update({k: str(v) for k, v in entry(name).get("env", {}).items()})
    return env


# ---------------------------------------------------------------- expectations


def _expected_verdicts(exp: dict[str, Any]) -> list[str]:
    v = exp.get("verdict", "ok")
    return [v] if isinstance(v, str) else list(v)


def _same_file(path: str | None, script: Path) -> bool:
    if not path:
        return False
    try:
        return Path(path).resolve() == script.resolve()
    except OSError:
        return Path(path).name == script.name


def report_problems(name: str, report: dict[str, Any]) -> list[str]:
    """Differences between a ddp-doctor report dict and what scenarios.json expects of ``name``.

    An empty list means the report is right.  Rules:
    - verdict is the expected one (an entry may list several acceptable verdicts);
    - every expected finding is present with that code, with exactly the expected ranks
      (unless the expectation says ``"ranks": null``), and, when ``"marker": true``,
      with ``location`` in this script at a ``# expect: CODE`` line;
    - no finding of a code listed in ``"forbid"`` appears, but as info (a slow rank's live warning kept
      in the report: the policy allows it on a correct job);
    - twins additionally: no finding of severity error at all;
    - runtime findings only: findings with ``"source": "lint"`` / ``"check"`` are ignored;
    - hang scenarios: if the report has ``duration_s``, it is below the scripts' process-group
      timeout (the job must be stopped before gloo's own timeout fires).
    Extra findings not forbidden are allowed (e.g. DDP203 next to the DDP201 that caused it).
    """
    exp = entry(name)["expect"]
    script = script_path(name)
    problems: list[str] = []
    if is_twin(name) and torch_teardown_abort(report):
        return []
    verdict = report.get("verdict")
    if verdict not in _expected_verdicts(exp):
        problems.append(f"verdict {verdict!r}, expected {' or '.join(_expected_verdicts(exp))}")
    pg_timeout = float(entry(name).get("env", {}).get("DDP_TIMEOUT", DEFAULT_PG_TIMEOUT_S))
    if "hang" in _expected_verdicts(exp) \
            and isinstance(report.get("duration_s"), (int, float)) and report["duration_s"] >= pg_timeout:
        problems.append(f"hang diagnosed after {report['duration_s']:.0f} s: not before the {pg_timeout:.0f} s "
                        "process-group timeout")
    findings = [f for f in report.get("findings", []) if f.get("source", "runtime") == "runtime"]
    for want in exp.get("findings", []):
        code = want["code"]
        got = [f for f in findings if f.get("code") == code]
        if not got:
            problems.append(f"missing finding {code} (got {sorted({f.get('code') for f in findings})})")
            continue
        if want.get("ranks") is not None:
            ranked = [f for f in got if sorted(f.get("ranks") or []) == sorted(want["ranks"])]
            if not ranked:
                problems.append(f"{code}: ranks {[f.get('ranks') for f in got]}, expected {sorted(want['ranks'])}")
                continue
            got = ranked
        if want.get("marker"):
            lines = marker_lines(name, code)
            ok = [f for f in got if (f.get("location") or {}).get("line") in lines
                  and _same_file((f.get("location") or {}).get("path"), script)]
            if not ok:
                locs = [(f.get("location") or {}) for f in got]
                problems.append(f"{code}: location {[(loc.get('path'), loc.get('line')) for loc in locs]}, "
                                f"expected {script.name}:{lines}")
    for code in exp.get("forbid", []):  # (an info finding -- a slow rank's live warning -- is allowed)
        bad = [f for f in findings if f.get("code") == code and f.get("severity") != "info"]
        if bad:
            problems.append(f"forbidden finding {code} reported (ranks {[f.get('ranks') for f in bad]})")
    if is_twin(name):
        errors = [f.get("code") for f in findings if f.get("severity") == "error"]
        if errors:
            problems.append(f"clean twin reported error findings {errors}")
    return problems


def torch_teardown_abort(report: dict[str, Any]) -> bool:
    """A clean job whose training completed, and then torch aborted a rank while tearing it down (gloo's
    "terminate called without an active exception" in destroy_process_group or at exit: torch's own race,
    seen under plain torchrun too, about 1 run in 10 on a loaded box), diagnosed as exactly that: every error
    finding is DDP204 on a rank whose program had finished or was tearing down.  A twin's job did nothing
    wrong in that run, and ddp-doctor said so; nothing else about the run is accepted this way."""
    errors = [f for f in report.get("findings", []) if f.get("severity") == "error"]
    return report.get("verdict") == "crash" and bool(errors) and all(
        f.get("code") == "DDP204" and (f.get("evidence") or {}).get("finished_program") for f in errors)


def assert_run_report(name: str, res: "CommandResult", report: dict[str, Any] | None) -> None:
    """Everything a ``ddp-doctor run`` of ``name`` must satisfy (tests/run/test_scenarios_run.py and the
    parity jobs of tests/parity): a report/v1 report, no contradiction between its sentences and its facts,
    the expectation of scenarios.json, no process left behind, and the exit status the report names."""
    import jsonschema

    from ddp_doctor.report import REPORT_JSON_SCHEMA

    assert report is not None, (res.stdout + res.stderr)[-3000:]
    jsonschema.validate(report, REPORT_JSON_SCHEMA)
    assert report.get("contradictions") == [], report.get("contradictions")  # every sentence agrees with the facts
    problems = report_problems(name, report)
    assert not problems, (problems, [(f["code"], f["ranks"], f["message"][:300]) for f in report["findings"]])
    assert not res.leftovers, res.leftovers
    assert report["exit_code"] == res.returncode, (report["exit_code"], res.returncode, res.stderr[-2000:])
    if report["verdict"] == "ok":
        assert res.returncode == 0
    else:
        assert res.returncode != 0


# ---------------------------------------------------------------- running


@dataclass
class CommandResult:
    """What :func:`run_command` observed."""

    argv: list[str]
    returncode: int | None          # None only if it could not be reaped
    duration_s: float
    timed_out: bool
    stdout: str
    stderr: str
    pgid: int
    pids: list[int] = field(default_factory=list)   # every process seen in the group while it ran
    leftovers: list[str] = field(default_factory=list)  # processes still alive after the kill

    @property
    def signal(self) -> int | None:
        return -self.returncode if self.returncode is not None and self.returncode < 0 else None


def _group_members(pgid: int) -> list[Any]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid:
                out.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            pass
    return out


def leftover_processes(pgid: int | None = None, pids: Iterable[int] = ()) -> list[str]:
    """Descriptions of live (non-zombie) processes in group ``pgid`` or among ``pids``."""
    import psutil

    found: dict[int, Any] = {p.pid: p for p in (_group_members(pgid) if pgid else [])}
    for pid in pids:
        try:
            found.setdefault(pid, psutil.Process(pid))
        except psutil.Error:
            pass
    out = []
    for pid, p in sorted(found.items()):
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue
            out.append(f"{pid} {' '.join(p.cmdline())[:200]}")
        except psutil.Error:
            pass
    return out


def assert_no_leftovers(pgid: int | CommandResult | None = None, pids: Iterable[int] = (), grace_s: float = 5.0) -> None:
    """Fail (AssertionError) if any process of the group / pid list is still alive after ``grace_s``."""
    if isinstance(pgid, CommandResult):
        pids = list(pids) + pgid.pids
        pgid = pgid.pgid
    deadline = time.monotonic() + grace_s
    while True:
        left = leftover_processes(pgid, pids)
        if not left or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert not left, "processes left behind:\n  " + "\n  ".join(left)


def _kill_group(pgid: int) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        t = time.monotonic()
        while time.monotonic() - t < 3:
            if not leftover_processes(pgid):
                return
            time.sleep(0.1)


def run_command(argv: list[str], timeout: float, env: dict[str, str] | None = None,
                cwd: str | os.PathLike | None = None, leftover_grace_s: float = 5.0) -> CommandResult:
    """Run ``argv`` in a new process group; on timeout kill the whole group (TERM, then KILL).

    Never raises on failure or timeout: look at ``returncode`` / ``timed_out``.
    Every descendant seen while it ran is tracked too (torch's launcher puts each rank in its
    own session, so the group alone does not reach them).  ``leftovers`` lists the processes
    still alive ``leftover_grace_s`` after the command ended (they are killed before returning).
    """
    import psutil

    t0 = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd, start_new_session=True)
    pgid = proc.pid  # start_new_session: the child leads its own session and group
    seen: set[int] = {proc.pid}
    timed_out = False
    out_chunks: list[str] = []
    err_chunks: list[str] = []

    import threading

    def pump(stream, sink):
        for line in stream:
            sink.append(line)

    readers = [threading.Thread(target=pump, args=(proc.stdout, out_chunks), daemon=True),
               threading.Thread(target=pump, args=(proc.stderr, err_chunks), daemon=True)]
    for r in readers:
        r.start()
    while True:
        try:
            proc.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            pass
        try:
            seen.update(c.pid for c in psutil.Process(proc.pid).children(recursive=True))
        except psutil.Error:
            pass
        if time.monotonic() - t0 > timeout:
            timed_out = True
            _kill_group(pgid)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            break
    duration = time.monotonic() - t0
    # ranks run in their own sessions (torch's launcher uses start_new_session): give the
    # launcher's own shutdown of its workers a moment before calling anything a leftover
    deadline = time.monotonic() + leftover_grace_s
    while True:
        leftovers = leftover_processes(pgid, seen - {proc.pid})
        if not leftovers or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    if leftovers:
        _kill_group(pgid)
        for pid in seen:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
    for r in readers:
        r.join(timeout=2)
    return CommandResult(argv=list(argv), returncode=proc.returncode, duration_s=round(duration, 1),
                         timed_out=timed_out, stdout="".join(out_chunks), stderr="".join(err_chunks),
                         pgid=pgid, pids=sorted(seen), leftovers=leftovers)


def plain_torchrun(name: str, timeout: float = 180.0, env: dict[str, str] | None = None) -> CommandResult:
    """Run ``name`` under plain ``python -m torch.distributed.run`` (the baseline without ddp-doctor)."""
    return run_command([sys.executable, "-m", "torch.distributed.run", *torchrun_argv(name)],
                       timeout=timeout, env=scenario_env(name, env))


_INTERESTING = re.compile(r"(Error|error|Exception|EnforceNotMet|Timed out|timed out|Connection closed|"
                          r"Signal|SIGKILL|SIGABRT|exitcode|ChildFailedError|rank\s*:|Traceback)")


def summarize(res: CommandResult, lines: int = 12) -> str:
    """A few lines describing how a run ended (for recording plain_torchrun behaviour)."""
    err = [line.rstrip() for line in res.stderr.splitlines() if _INTERESTING.search(line)]
    head = (f"rc={res.returncode} t={res.duration_s}s timed_out={res.timed_out} "
            f"leftovers={len(res.leftovers)}")
    return "\n".join([head, *err[-lines:], "--- stdout tail:", *res.stdout.splitlines()[-4:]])


def _expect_text(e: dict[str, Any]) -> str:
    exp = e["expect"]
    verdict = exp["verdict"] if isinstance(exp["verdict"], str) else " or ".join(exp["verdict"])
    parts = []
    for f in exp.get("findings", []):
        ranks = "any ranks" if f.get("ranks") is None else "ranks " + ",".join(map(str, f["ranks"]))
        where = f" at line {marker_line(Path(e['script']).stem, f['code'])}" if f.get("marker") else ""
        parts.append(f"{f['code']} ({ranks}{where})")
    text = f"**{verdict}**" + (": " + "; ".join(parts) if parts else "")
    if exp.get("forbid"):
        text += "; never " + ", ".join(exp["forbid"])
    return text


def markdown_coverage() -> str:
    """One line per finding code: the scenarios that must produce it, and the twins that must not."""
    by_code: dict[str, list[str]] = {}
    for n, e in _load().items():
        for f in e["expect"].get("findings", []):
            by_code.setdefault(f["code"], []).append(n)
    lines = ["| code | must be reported by | clean twins |", "|---|---|---|"]
    for code in sorted(by_code):
        twins = sorted({t for n in by_code[code] for t in [entry(n).get("twin")] if t})
        lines.append(f"| {code} | {', '.join(f'`{n}`' for n in by_code[code])} | {', '.join(f'`{t}`' for t in twins)} |")
    return "\n".join(lines)


def markdown_table() -> str:
    """The scenario table of docs/scenarios.md, generated from scenarios.json."""
    rows = ["| scenario | issue | twin | what it does | plain torchrun (observed) | ddp-doctor must report |",
            "|---|---|---|---|---|---|"]
    for n, e in _load().items():
        twin = e.get("twin") or ("twin of " + ", ".join(e["twin_of"]) if e.get("twin_of") else "-")
        cells = [f"`{e['script']}`", e["issue"], twin, e["why"],
                 f"{e['plain_torchrun']} (rc {e['plain']['exit_code']}, ~{e['plain']['seconds']:.0f} s)",
                 _expect_text(e)]
        rows.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
    return "\n".join(rows)


def doctor_run(name: str, report_path: str | os.PathLike, timeout: float = 240.0,
               extra_options: Iterable[str] = (), env: dict[str, str] | None = None) -> CommandResult:
    """Run ``name`` under ``python -m ddp_doctor run --report REPORT_PATH [extra_options] <torchrun argv>``."""
    return run_command([sys.executable, "-m", "ddp_doctor", "run", "--report", str(report_path), *doctor_options(name),
                        *extra_options, *torchrun_argv(name)], timeout=timeout, env=scenario_env(name, env))


def _doctor(todo: list[str], timeout: float, report_dir: str | None) -> int:
    import tempfile

    out_dir = Path(report_dir or tempfile.mkdtemp(prefix="ddp-doctor-scenarios-"))
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    for n in todo:
        rep = out_dir / f"{n}.json"
        rep.unlink(missing_ok=True)
        res = doctor_run(n, rep, timeout=timeout)
        try:
            report = json.loads(rep.read_text())
        except (OSError, ValueError) as exc:
            failed += 1
            print(f"FAIL {n}: no report ({exc}); {summarize(res, lines=6)}", flush=True)
            continue
        problems = report_problems(n, report)
        if res.leftovers:
            problems.append(f"leftover processes: {res.leftovers}")
        got = [(f.get("code"), f.get("ranks"), (f.get("location") or {}).get("line")) for f in report.get("findings", [])
               if f.get("source", "runtime") == "runtime"]
        failed += bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {n}: verdict={report.get('verdict')} rc={res.returncode} "
              f"t={res.duration_s}s findings={got}" + "".join(f"\n       - {p}" for p in problems), flush=True)
    print(f"{len(todo) - failed}/{len(todo)} scenarios as expected; reports in {out_dir}")
    return 1 if failed else 0


def _main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="manifest.py")
    sub = ap.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("list")
    ls.add_argument("--issue", choices=["run", "perf"])
    ob = sub.add_parser("observe", help="run scenarios under plain torchrun and print what happens")
    ob.add_argument("names", nargs="+")
    ob.add_argument("--timeout", type=float, default=180)
    ob.add_argument("--save-dir", help="write each run's full stdout/stderr there")
    tb = sub.add_parser("table", help="print the markdown tables of docs/scenarios.md")
    tb.add_argument("--write", action="store_true", help="rewrite them in docs/scenarios.md instead")
    dr = sub.add_parser("doctor", help="run scenarios under `python -m ddp_doctor run` and compare each report "
                                       "with its expectation (uses the ddp_doctor found on PYTHONPATH)")
    dr.add_argument("names", nargs="*", help="default: all (or --issue)")
    dr.add_argument("--issue", choices=["run", "perf"])
    dr.add_argument("--timeout", type=float, default=240)
    dr.add_argument("--report-dir", default=None, help="keep the JSON reports there")
    a = ap.parse_args(argv)
    if a.cmd == "doctor":
        return _doctor(a.names or names(a.issue), a.timeout, a.report_dir)
    if a.cmd == "table":
        tables = "## Coverage by finding code\n\n" + markdown_coverage() + "\n\n## Every scenario\n\n" + markdown_table()
        if not a.write:
            print(tables)
            return 0
        doc = HERE.parents[1] / "docs" / "scenarios.md"
        text = doc.read_text()
        start = text.index("## Coverage by finding code")
        end = text.find("\n## ", text.index("## Every scenario", start) + 5)
        doc.write_text(text[:start] + tables + "\n" + (text[end:] if end != -1 else ""))
        return 0
    if a.cmd == "list":
        for n in names(a.issue):
            e = entry(n)
            print(f"{n:36} {e.get('issue'):5} {e['expect'].get('verdict')!s:8} "
                  f"{','.join(f['code'] for f in e['expect'].get('findings', [])) or '-'}")
        return 0
    for n in a.names:
        n = Path(n).stem
        if n in _load():
            res = plain_torchrun(n, timeout=a.timeout)
        else:  # a script not (yet) in scenarios.json: default options
            res = run_command([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", str(HERE / f"{n}.py")],
                              timeout=a.timeout)
        if a.save_dir:
            Path(a.save_dir, f"{n}.err").write_text(res.stderr)
            Path(a.save_dir, f"{n}.out").write_text(res.stdout)
        print(f"=== {n}\n{summarize(res)}\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
