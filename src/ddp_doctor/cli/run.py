"""``ddp-doctor run [--hang-timeout S] [--report PATH] [--html PATH] [torchrun options] SCRIPT [ARGS...]``.

A drop-in for torchrun: ranks are launched by torch's own elastic launcher with
the probe (``python -m ddp_doctor.probe``) in front of the user's program; a
watcher thread in this process reads every rank's state from a side-channel
TCPStore and, on a hang, desync or rank exit, collects stacks, diagnoses, stops
every process the job started and writes the report.  Exit code: the job's own
when it is healthy; non-zero when ddp-doctor diagnosed a failure.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import Any

from ddp_doctor.procs import descendants, terminate

OWN_USAGE = """usage: ddp-doctor run [--hang-timeout S] [--report PATH] [--html PATH] [--no-lint]
                      [--watch-port PORT] [torchrun options] SCRIPT|-m MODULE [ARGS...]

ddp-doctor options (before the script; everything else is torchrun's):
  --hang-timeout S   declare a hang when no rank progresses for S seconds
                     (default: adaptive, learned from the job's own step times)
  --report PATH      write the JSON report (ddp-doctor/report/v1) to PATH
  --html PATH        write the HTML report to PATH
  --no-lint          do not lint the script before launching
  --watch-port PORT  port of the side-channel store (multi-node; default: rdzv port + 1)
  --stop-grace S     seconds between SIGTERM and SIGKILL when stopping the job (default 3)
"""

OWN_VALUE_OPTS = {"--hang-timeout", "--report", "--html", "--watch-port", "--stop-grace"}
OWN_FLAGS = {"--no-lint", "--quiet"}
GRACE_S = 3.0


def split_argv(argv: list[str]) -> tuple[dict[str, Any], list[str]]:
    """Separate ddp-doctor's options from torchrun's (ours are recognised before the script only)."""
    from torch.distributed import run as torchrun

    parser = torchrun.get_args_parser()
    no_value = set()
    for action in parser._actions:
        if action.nargs == 0:
            no_value.update(action.option_strings)
    own: dict[str, Any] = {}
    rest: list[str] = []
    i = 0
    while i < len(argv):
        tok = argv[i]
        name, eq, val = tok.partition("=")
        if name in OWN_VALUE_OPTS:
            if eq:
                own[name] = val
                i += 1
            else:
                if i + 1 >= len(argv):
                    raise SystemExit(f"ddp-doctor run: {name} needs a value")
                own[name] = argv[i + 1]
                i += 2
            continue
        if tok in OWN_FLAGS:
            own[tok] = True
            i += 1
            continue
        if not tok.startswith("-") or tok == "--":
            rest += argv[i:]
            break
        rest.append(tok)
        if tok in ("-m", "--module"):
            i += 1
            rest += argv[i:]
            break
        if eq or tok in no_value:
            i += 1
        else:
            if i + 1 < len(argv):
                rest.append(argv[i + 1])
            i += 2
    return own, rest


def _world_size_hint(args) -> int:
    from torch.distributed import run as torchrun

    try:
        lo, _hi = torchrun.parse_min_max_nnodes(args.nnodes)
        return lo * torchrun.determine_local_world_size(args.nproc_per_node)
    except Exception:
        return 1


def _lint(script: str, module: bool) -> list:
    if module or not os.path.isfile(script):
        return []
    try:
        from ddp_doctor.lint import lint_paths
    except ImportError:
        return []
    try:
        return list(lint_paths([script]).findings)
    except Exception as e:
        print(f"ddp-doctor: lint failed ({e!r}); running anyway", file=sys.stderr)
        return []


# the ranks-fall-out-of-step family: lint's guess at the cause and the runtime's name for what happened
# may differ (lint DDP201 at a line the runtime calls DDP202/DDP203); other codes confirm only themselves
_STEP_FAMILY = {"DDP101", "DDP201", "DDP202", "DDP203", "DDP204"}


def _same_hazard(lint_code: str, runtime_code: str) -> bool:
    return lint_code == runtime_code or {lint_code, runtime_code} <= _STEP_FAMILY


def _leftovers(how: dict[int, str]) -> list[int]:
    return [pid for pid, h in how.items() if h == "alive"]


class Job:
    """One ``ddp-doctor run``: the watcher, the stop, the report."""

    def __init__(self, own: dict[str, Any], args: argparse.Namespace, argv: list[str]) -> None:
        self.own = own
        self.args = args
        self.argv = argv
        self.t0 = time.time()
        self.started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self.hang_timeout = float(own["--hang-timeout"]) if own.get("--hang-timeout") else None
        self.grace = float(own.get("--stop-grace", GRACE_S))
        self.watcher = None
        self.store = None
        self.stop_requested = threading.Event()
        self.stop_lock = threading.Lock()
        self.launching = False
        self.stop_t: float | None = None
        self.procs: list = []
        self.leftovers: list[int] = []
        self.failures: dict[int, dict[str, Any]] = {}
        self.nnodes = 1

    @classmethod
    def for_report(cls, watcher, *, argv: list[str], script: str, t0: float, nnodes: str = "1") -> "Job":
        """A Job that only assembles a report from ``watcher`` (the embedded watcher of watch.embedded)."""
        job = cls({}, argparse.Namespace(nnodes=nnodes, training_script=script, max_restarts=0), argv)
        job.watcher = watcher
        job.t0 = t0
        return job

    # -- side channel ----------------------------------------------------------------
    def open_store(self) -> bool:
        """Host the store (single node, or the first node of a multi-node job); else join it."""
        from ddp_doctor.watch import host_store, join_store

        a = self.args
        nnodes_max = 1
        try:
            from torch.distributed import run as torchrun

            nnodes_max = torchrun.parse_min_max_nnodes(a.nnodes)[1]
        except Exception:
            pass
        self.nnodes = nnodes_max
        _job_secret(multi_node=nnodes_max > 1 and not a.standalone)
        if nnodes_max <= 1 or a.standalone:
            self.store, port = host_store(0)
            self.store_addr = f"127.0.0.1:{port}"
            return True
        endpoint = a.rdzv_endpoint or f"{a.master_addr}:{a.master_port or 29500}"
        host, _, port = endpoint.rpartition(":")
        host = host or "127.0.0.1"
        wport = int(self.own.get("--watch-port") or (int(port or 29400) + 1))
        self.store_addr = f"{host}:{wport}"
        if a.node_rank == 0 and _is_local(host):
            try:
                self.store, _ = host_store(wport)
                return True
            except Exception:
                pass
        self.store = join_store(host, wport)
        return False

    # -- stopping --------------------------------------------------------------------
    def on_decision(self, decision: dict[str, Any]) -> None:
        """Called from the watcher thread once it has decided and taken the stacks."""
        try:
            self.store.set("ddpd/stop", json.dumps({"reason": decision.get("reason")}))
        except Exception:
            pass
        self.stop()

    def stop(self) -> None:
        if self.stop_requested.is_set():
            return
        self.stop_requested.set()
        self.stop_t = time.monotonic()
        self.procs = descendants()
        # torch's own shutdown path: the agent's SIGTERM handler raises SignalException in the main
        # thread and the agent terminates every rank's process group (ranks + loader workers).
        with self.stop_lock:
            if self.launching:
                os.kill(os.getpid(), signal.SIGTERM)
        threading.Thread(target=self._reap, daemon=True, name="ddp-doctor-stop").start()

    def _reap(self) -> None:
        time.sleep(self.grace)
        self.leftovers = _leftovers(terminate([p for p in self.procs if p.is_running()], 1.0))

    def follower_loop(self) -> None:
        """On a node that does not host the store: stop when the host says so."""
        while not self.stop_requested.is_set():
            try:
                if self.store.check(["ddpd/stop"]):
                    self.stop()
                    return
            except Exception:
                pass
            time.sleep(0.3)

    # -- the run ---------------------------------------------------------------------
    def run(self) -> int:
        from ddp_doctor import launch
        from ddp_doctor.watch import Watcher

        a = self.args
        lint_findings = _lint(a.training_script, a.module)
        is_host = self.open_store()
        run_dir = tempfile.mkdtemp(prefix="ddp-doctor-")
        os.environ["DDP_DOCTOR_STORE"] = self.store_addr
        os.environ["DDP_DOCTOR_DIR"] = run_dir
        os.environ["DDP_DOCTOR_T0"] = repr(self.t0)
        os.environ["DDP_DOCTOR_LAUNCHER_PID"] = str(os.getpid())  # ranks die with this process (probe.lifeline)
        a.monitor_interval = max(float(a.monitor_interval), 1.0)  # let the watcher see an exit first
        self.watcher = Watcher(self.store, world_size=_world_size_hint(a), hang_timeout=self.hang_timeout,
                               run_dir=run_dir, is_host=is_host, on_decision=self.on_decision,
                               max_restarts=int(a.max_restarts or 0))
        self.watcher.start()
        if not is_host:
            threading.Thread(target=self.follower_loop, daemon=True).start()
        job_error: BaseException | None = None
        live_stop = threading.Event()
        if not self.own.get("--quiet"):
            threading.Thread(target=self._live, args=(live_stop,), daemon=True, name="ddp-doctor-live").start()
        self.launching = True
        try:
            try:
                launch.launch(a, "ddp_doctor.probe")
            finally:
                # a stop decided just as the job ended must not interrupt the report
                with self.stop_lock:
                    self.launching = False
                if threading.current_thread() is threading.main_thread():
                    signal.signal(signal.SIGTERM, lambda *_: None)
        except BaseException as e:  # ChildFailedError, SignalException, KeyboardInterrupt
            job_error = e
            self.failures = _failures(e)
            if isinstance(e, KeyboardInterrupt) or (type(e).__name__ == "SignalException" and not self.stop_requested.is_set()):
                self.procs = descendants()
                self.leftovers = _leftovers(terminate(self.procs, self.grace))
        t_end = time.monotonic()
        live_stop.set()
        self.watcher.stopping.set()
        self.watcher.join(timeout=5)
        if self.stop_requested.is_set():
            time.sleep(0.1)
            deadline = time.monotonic() + self.grace + 3
            while any(p.is_running() and p.status() != "zombie" for p in self.procs) and time.monotonic() < deadline:
                time.sleep(0.1)
            self.leftovers = [p.pid for p in self.procs if p.is_running() and p.status() != "zombie"]
        try:
            self.watcher.read_states()
        except Exception:
            pass
        try:
            report = self.build_report(job_error, lint_findings, t_end)
        finally:
            # the stack dumps are in the report now: leave nothing behind in the temp dir
            shutil.rmtree(run_dir, ignore_errors=True)
        return self.emit(report, is_host)

    def _live(self, stop: threading.Event) -> None:
        """Feed the report's LiveView (one row per rank) from the watcher's states, once a second."""
        try:
            from ddp_doctor.report.terminal import LiveView
        except ImportError:
            return
        try:
            with LiveView(self.watcher.world_size, file=sys.stderr) as view:
                while not stop.wait(1.0) and not self.stop_requested.is_set():
                    view.update(live_rows(self.watcher))
        except Exception:
            pass

    def build_report(self, job_error, lint_findings, t_end) -> dict[str, Any]:
        from ddp_doctor.diagnose import diagnose

        w = self.watcher
        decision = w.decision
        if decision is None or (decision.get("reason") == "exit" and not decision.get("finished")):
            # ranks that failed together inside one collective: their final states may show the mismatch
            try:
                late = w.find_desync()
            except Exception:
                late = None
            if late is not None:
                decision = {**(decision or {}), **late}
        from ddp_doctor.watch import FATAL

        for r, info in self.failures.items():  # exits the agent reaped before the watcher saw them
            v = w.views.get(r)
            if v is not None and v.state and not v.exit:
                v.exit = info
                if info.get("signal") in FATAL and not v.stack and v.state.get("pid"):
                    v.stack = w.fatal_stack(v.state["pid"])
        evidence = w.evidence()
        evidence["lint"] = [{"code": f.code, "path": f.location.path, "line": f.location.line}
                            for f in lint_findings if f.location]
        verdict, findings = diagnose(evidence, decision, self.failures)
        exit_code = 0
        if verdict == "crash":
            # the root rank's own exit status (as a shell shows it: 128+N for a signal)
            root = findings[0].ranks[0] if findings and findings[0].ranks else None
            code = (self.failures.get(root) or (evidence["ranks"].get(root) or {}).get("exit") or {}).get("exit_code")
            if not code:
                code = next((c for c in (f.get("exit_code") for f in self.failures.values()) if c), 1)
            exit_code = 128 - code if code < 0 else code
        elif verdict != "ok":
            exit_code = 1
        elif job_error is not None:
            exit_code = 1
        runtime = [f.to_report_dict() | {"source": "runtime"} for f in findings]
        lint = [f.to_report_dict() | {"source": "lint"} for f in lint_findings]
        for rf in runtime:
            loc = rf.get("location")
            if not loc:
                continue
            for lf in lint:
                ll = lf.get("location") or {}
                if ll.get("line") == loc.get("line") and os.path.basename(ll.get("path", "")) == os.path.basename(loc["path"]) \
                        and _same_hazard(lf["code"], rf["code"]):
                    lf["severity"] = "error"
                    lf["confirmed_by_runtime"] = rf["code"]
                    rf["evidence"]["lint"] = {"code": lf["code"], "message": lf["message"]}
                    rf["message"] += (f" ddp-doctor lint flagged this line before the run ({lf['code']}): "
                                      "the static warning came true.")
                    break
        report: dict[str, Any] = {
            "schema": "ddp-doctor/report/v1",
            "verdict": verdict,
            "exit_code": exit_code,
            "world_size": w.world_size,
            "findings": runtime,
            "ranks": [self._rank_entry(r, st) for r, st in sorted(evidence["ranks"].items())],
            "command": ["ddp-doctor", "run", *self.argv],
            "started_at": self.started_at,
            "duration_s": round(time.time() - self.t0, 3),
            "hang_timeout_s": evidence.get("hang_limit_s"),
            "nnodes": str(self.args.nnodes),
            "lint": {"path": self.args.training_script, "findings": lint},
        }
        if decision is not None:
            t_detect = decision.get("t_detect")
            stats = {"reason": decision.get("reason"), "limit": evidence.get("hang_limit_how")}
            if t_detect and decision.get("stalled_s") is not None:
                stats["stalled_s_at_detection"] = decision["stalled_s"]
            if t_detect:
                stats["detect_to_stacks_s"] = round(decision["t_stacks"] - t_detect, 3)
                stats["detect_to_stopped_s"] = round(t_end - t_detect, 3)
            report["detection"] = stats
        if getattr(w, "earlier", None):
            report["attempt"] = w.attempt
            report["restarts"] = [self._earlier_attempt(e, evidence["lint"]) for e in w.earlier]
        if self.leftovers:
            report["leftover_pids"] = self.leftovers
        side = self.side_channel_section()
        if side is not None:
            report["side_channel"] = side
        return report

    def side_channel_section(self) -> dict[str, Any] | None:
        """Was the side channel signed, what did it drop, and which ranks/nodes went unwatched."""
        stats = getattr(self.store if self.store is not None else getattr(self.watcher, "store", None), "stats", None)
        if stats is None:
            return None
        out = stats.to_dict()
        try:
            from torch.distributed import run as torchrun

            local_ws = max(1, int(torchrun.determine_local_world_size(self.args.nproc_per_node)))
        except Exception:
            local_ws = 1
        if out["lost"]:
            # this node never reached the side channel: its own ranks went unwatched (their global
            # numbers are the rendezvous's to give, unknown here)
            out["unwatched_ranks"] = []
            out["unwatched_nodes"] = [f"node-rank {int(getattr(self.args, 'node_rank', 0) or 0)} (this node)"]
            return out
        ranks = [r for r, v in sorted(self.watcher.views.items()) if v.state is None]
        out["unwatched_ranks"] = ranks
        out["unwatched_nodes"] = [f"node {n} (ranks {', '.join(str(r) for r in ranks if r // local_ws == n)})"
                                  for n in sorted({r // local_ws for r in ranks})]
        return out

    def _earlier_attempt(self, earlier: dict[str, Any], lint: list[dict]) -> dict[str, Any]:
        """The diagnosis of an attempt torch's agent restarted after a failure (``--max-restarts``)."""
        from ddp_doctor.diagnose import diagnose

        evidence = {**earlier["evidence"], "lint": lint}
        verdict, findings = diagnose(evidence, earlier["decision"], {})
        return {"attempt": earlier["attempt"], "verdict": verdict,
                "findings": [f.to_report_dict() | {"source": "runtime"} for f in findings],
                "ranks": [self._rank_entry(r, st, failures={}) for r, st in sorted(evidence["ranks"].items())]}

    def _rank_entry(self, r: int, st: dict[str, Any], failures: dict[int, dict] | None = None) -> dict[str, Any]:
        ex = st.get("exit") or (self.failures if failures is None else failures).get(r) or {}
        stack = st.get("stack") or []
        if not stack and st.get("exc"):
            stack = st["exc"].get("traceback") or []
        if st.get("missing"):
            state = "missing"
        elif st.get("exc"):
            state = "crashed"
        elif ex.get("signal") and ex.get("signal") != "SIGTERM":
            state = "killed"
        elif st.get("done"):
            state = "finished"
        elif st.get("in_collective"):
            state = "in_collective"
        elif st.get("in_data_wait"):
            state = "data_wait"
        elif ex:
            state = "stopped" if ex.get("signal") == "SIGTERM" else "exited"
        else:
            state = "running"
        entry = {
            "rank": r, "state": state, "epoch": st.get("epoch"), "step": st.get("step"),
            "last_collective": st.get("in_collective") or st.get("last_collective"),
            "stack": stack, "exit_code": ex.get("exit_code", st.get("exit_code")),
            "signal": ex.get("signal"),
        }
        for k in ("host", "pid", "local_rank", "timing", "timeline", "workers", "exc", "where", "forwards",
                  "steps_by_epoch", "loaders", "ddp"):
            if st.get(k) is not None:
                entry[k] = st[k]
        return entry

    def emit(self, report: dict[str, Any], is_host: bool) -> int:
        from ddp_doctor.report import write_json

        if not is_host and self.store is not None:
            # one job, one diagnosis: take the hosting node's report (it names global ranks)
            end = time.monotonic() + 20
            while time.monotonic() < end:
                try:
                    if self.store.check(["ddpd/report"]):
                        report = json.loads(self.store.get("ddpd/report"))
                        self.store.add("ddpd/report_read", 1)
                        break
                except Exception:
                    if getattr(self.store, "lost", True) or not getattr(self.store, "connected", True):
                        break
                time.sleep(0.2)
        elif self.store is not None and self.own:
            try:
                self.store.set("ddpd/report", json.dumps(report))
                followers = self.nnodes - 1
                end = time.monotonic() + (10 if followers > 0 else 0)
                while followers > 0 and time.monotonic() < end and self.store.add("ddpd/report_read", 0) < followers:
                    time.sleep(0.2)
            except Exception:
                pass
        try:
            from ddp_doctor.report.snippets import attach_snippets

            report = attach_snippets(report)
        except Exception:
            pass
        if self.own.get("--report"):
            write_json(report, self.own["--report"])
        if self.own.get("--html"):
            try:
                from ddp_doctor.report.html import write_html

                write_html(report, self.own["--html"])
            except ImportError:
                print("ddp-doctor: HTML report not available in this build", file=sys.stderr)
        if not self.own.get("--quiet"):
            _print(report)
        return int(report["exit_code"])


def live_rows(watcher) -> list[dict[str, Any]]:
    """LiveView rows from the watcher's latest states (plain data; the view formats)."""
    rows = []
    for r, v in sorted(watcher.views.items()):
        st = v.state or {}
        times = st.get("step_times") or []
        tm = st.get("timing") or {}
        c = st.get("in_collective")
        w = (c or {}).get("site") or st.get("where") or {}
        rows.append({
            "rank": r,
            "state": ("finished" if st.get("done") else "in " + c["op"] if c else
                      "data wait" if st.get("in_data_wait") else "running" if st else "starting"),
            "epoch": st.get("epoch"), "step": st.get("step"),
            "steps_per_s": round(len(times[-20:]) / sum(times[-20:]), 2) if times and sum(times[-20:]) > 0 else None,
            "data_wait_pct": round(100 * tm["data_wait_s"] / tm["step_time_s"], 1) if tm.get("step_time_s") else None,
            "where": f"{os.path.basename(w['path'])}:{w['line']}" if w.get("path") else "",
        })
    return rows


def _print(report: dict[str, Any]) -> None:
    try:
        from ddp_doctor.report.terminal import print_report
    except ImportError:
        print_report = None
    if print_report is not None:
        print_report(report, file=sys.stderr)
        return
    # stop-gap until ddp_doctor.report.terminal lands
    print(f"ddp-doctor: verdict {report['verdict']} (exit {report['exit_code']})", file=sys.stderr)
    for f in report["findings"]:
        loc = f.get("location") or {}
        print(f"  {f['code']} {f['severity']} ranks {f['ranks']} {loc.get('path')}:{loc.get('line')}\n"
              f"    {f['message']}\n    fix: {f['fix']}", file=sys.stderr)


def _failures(e: BaseException) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {}
    for rank, pf in (getattr(e, "failures", None) or {}).items():
        code = getattr(pf, "exitcode", None)
        sig = None
        if isinstance(code, int) and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = str(-code)
        out[int(rank)] = {"exit_code": code, "signal": sig}
    return out


def _job_secret(multi_node: bool) -> None:
    """The side channel's HMAC key (``ddp_doctor.channel``), handed to the ranks in their environment.

    One node: made here, per job.  Several nodes: every node's launcher needs the same key and
    there is no channel to share it secretly, so it must come from the user (``DDP_DOCTOR_SECRET``
    on every node); without it the side channel runs unauthenticated, and says so."""
    from ddp_doctor.channel import SECRET_ENV, new_secret

    if os.environ.get(SECRET_ENV):
        return
    if multi_node:
        print(f"ddp-doctor: side channel unauthenticated (set the same {SECRET_ENV} on every node to sign it; "
              "see README 'Security model')", file=sys.stderr)
        return
    os.environ[SECRET_ENV] = new_secret()


def _is_local(host: str) -> bool:
    import socket

    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname()):
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(OWN_USAGE)
        print("torchrun options: see `torchrun --help`.")
        return 0 if argv else 2
    from ddp_doctor import launch

    own, rest = split_argv(argv)
    try:
        args = launch.parse_torchrun_args(rest)
    except SystemExit as e:
        return 2 if e.code else 0
    return Job(own, args, argv).run()
