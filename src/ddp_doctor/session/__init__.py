"""One ``ddp-doctor run``: the side channel, the launch through torch's elastic agent, the watcher, the stop.

Ranks are launched by torch's own elastic launcher with the probe (``python -m ddp_doctor.probe``) in
front of the user's program; the :class:`~ddp_doctor.watcher.Watcher` thread in this process reads every
rank's state from the side-channel store and, on a decision of :mod:`ddp_doctor.diagnose.live`, takes
the stacks; the job is then stopped through torch's own shutdown path and
:mod:`ddp_doctor.session.assemble` builds and writes the report.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import shutil
import sys
import tempfile
import threading
import time
from datetime import datetime, timezone
from typing import Any

from ddp_doctor import store as side
from ddp_doctor.channel import ensure_job_secret
from ddp_doctor.evidence import ExitStatus, Verdict
from ddp_doctor.procs import descendants, terminate
from ddp_doctor.session import assemble

GRACE_S = 3.0
# a signal that interrupts the job -> ddp-doctor's exit code (as a shell reports a process it killed)
INTERRUPT_EXIT = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129}


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
        self.stop_on_stall = bool(own.get("--stop-on-stall"))
        self.lint_findings: list = []
        self.grace = float(own.get("--stop-grace", GRACE_S))
        self.watcher = None
        self.store = None       # the side channel the job's verdict travels on (several nodes: the root store)
        self.local = None       # several nodes: this node's own store, its ranks post there
        self.stop_requested = threading.Event()
        self.stop_lock = threading.Lock()
        self.launching = False
        self.stop_t: float | None = None
        self.procs: list = []
        self.leftovers: list[int] = []
        self.failures: dict[int, ExitStatus] = {}
        self.nnodes = 1
        self.interrupted: int | None = None  # the signal that interrupted the job (SIGINT/SIGTERM/SIGHUP)

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
        a = self.args
        nnodes_max = 1
        try:
            from torch.distributed import run as torchrun

            nnodes_max = torchrun.parse_min_max_nnodes(a.nnodes)[1]
        except Exception:
            pass
        self.nnodes = nnodes_max
        ensure_job_secret(multi_node=nnodes_max > 1 and not a.standalone)
        if nnodes_max <= 1 or a.standalone:
            self.store, port = side.host_store(0)
            self.store_addr = f"127.0.0.1:{port}"
            return True
        # several nodes: this node's ranks post to a store of this node (no per-rank traffic between nodes),
        # signed with a secret of this node's own (only this launcher and its ranks use it: signed even when
        # the job has no DDP_DOCTOR_SECRET); this agent sends one summary per interval to the root store on
        # node 0 (rendezvous port + 1), signed with the job's secret
        from ddp_doctor.channel import new_secret

        self.node_secret = new_secret()
        self.local, lport = side.host_store(0, secret=self.node_secret.encode())
        self.store_addr = f"127.0.0.1:{lport}"
        endpoint = a.rdzv_endpoint or f"{a.master_addr}:{a.master_port or 29500}"
        host, _, port = endpoint.rpartition(":")
        host = host or "127.0.0.1"
        wport = int(self.own.get("--watch-port") or (int(port or 29400) + 1))
        self.root_addr = f"{host}:{wport}"
        if a.node_rank == 0 and _is_local(host):
            try:
                self.store, _ = side.host_store(wport)
                return True
            except Exception:
                pass
        self.store = side.join_store(host, wport)
        return False

    def _hierarchy(self, is_host: bool) -> dict[str, Any]:
        """Several nodes: the watcher's link to the root (a node) or the root itself (node 0)."""
        if self.local is None:
            return {}
        from torch.distributed import run as torchrun

        from ddp_doctor.watcher.root import Root, interval_for
        from ddp_doctor.watcher.uplink import Uplink

        local_world = max(1, int(torchrun.determine_local_world_size(self.args.nproc_per_node)))
        group = int(self.own.get("--watch-group") or 0)
        tree = 0 < group < self.nnodes - 1
        n_top = -(-(self.nnodes - 1) // group) if tree else self.nnodes
        common = {"local_world": local_world, "poll": interval_for(n_top)}
        if not is_host:
            link = self._group_link(group) if tree else Uplink(self.store)
            return {**common, "uplink": link, "on_stop": self.stop}
        slot = int(self.store.add(side.NODES, 1)) - 1
        reader = side.reader_channel(int(self.root_addr.rpartition(":")[2]))
        return {**common, "root": Root(self.store, reader, _world_size_hint(self.args), slot, t0=self.t0)}

    def _group_link(self, group: int):
        """A tree of watchers (``--watch-group N``): this node hosts a group store (watch port + 1; a free
        port if taken), says where on the root store, and reports to its group's leader (``watcher.tree``).
        The root's node (node rank 0) leads no group: groups are of node ranks 1.., N at a time."""
        import socket

        from ddp_doctor.watcher.tree import GroupLink, address_of, group_of, publish_address
        from ddp_doctor.watcher.uplink import Uplink

        from ddp_doctor.channel import SideChannel, job_secret

        key = job_secret()  # (now: the ranks' environment gets their node's own secret later)
        wport = int(self.root_addr.rpartition(":")[2])
        try:
            gstore, gport = side.host_store(wport + 1, secret=key)
        except Exception:
            gstore, gport = side.host_store(0, secret=key)
        me = int(self.args.node_rank)
        publish_address(self.store, me, f"{os.environ.get('DDP_DOCTOR_HOST') or socket.gethostname()}:{gport}")

        def connect(j: int):
            addr = address_of(self.store, j)
            if addr is None:
                return None
            h, p = side.split_address(addr)
            return SideChannel(connect=lambda: side.tcp_client(h, p, 10.0), secret=key, deadline=2.0, give_up_s=10.0)

        def own_detail(req: int, stacks: bool):
            w = self.watcher
            if stacks:
                w.collect_stacks()
                w.ack_all()
            return w.node_detail(req)

        members = [k + 1 for k in group_of(me - 1, self.nnodes - 1, group)]
        reader = SideChannel(side.tcp_client("127.0.0.1", gport, 1.0), secret=key)
        link = GroupLink(me, members, connect, gstore, reader, lambda: Uplink(self.store),
                         _world_size_hint(self.args), host=socket.gethostname(), t0=self.t0,
                         own_views=lambda: self.watcher.views, own_detail=own_detail)
        link.on_failover = lambda: self.watcher.summarizer.sent.clear()
        return link

    # -- stopping --------------------------------------------------------------------
    def on_decision(self, decision: Verdict) -> None:
        """Called from the watcher thread once it has decided and taken the stacks."""
        try:
            self.store.set(side.STOP, json.dumps({"reason": decision.reason}))
        except Exception:
            pass
        root = getattr(self.watcher, "root", None)
        if root is not None:
            root.stop(decision.reason)  # every node's agent stops its ranks
        self.stop()

    def on_stall(self, decision: Verdict) -> None:
        """Called from the watcher thread: a stall diagnosed (write and print the report, verdict
        ``stalled``; the job keeps running) or ended (say so).  Only the node that decides reports."""
        if decision.reason == "stalled":
            report = assemble.stall_report(self, decision)
            assemble.save_and_print(self, report)
        elif not self.own.get("--quiet"):
            print(f"ddp-doctor: the job moved again after {decision.stalled_s:.0f}s without a sign of life; "
                  "watching on", file=sys.stderr)

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

    # -- interruption --------------------------------------------------------------------
    def hook_interrupts(self) -> None:
        """Ctrl-C, SIGTERM, SIGHUP: take every rank's stacks while the ranks still live, then let torch's
        agent forward the signal to the ranks and wait out its grace period, as torchrun does.

        torch's agent installs its own handler when it starts the ranks (raising SignalException into
        the launch); ours wraps it, and a stop ddp-doctor itself decided (SIGTERM to this process)
        passes straight through."""
        from torch.distributed.elastic.multiprocessing import api

        orig = api._terminate_process_handler
        if getattr(orig, "__ddp_doctor_job__", None) is not None:
            orig = orig.__wrapped__

        def handler(signum, frame):
            if signum in INTERRUPT_EXIT and not self.stop_requested.is_set() and self.interrupted is None:
                self.interrupted = signum
                self.take_stacks()
            orig(signum, frame)

        handler.__wrapped__ = orig
        handler.__ddp_doctor_job__ = self
        api._terminate_process_handler = handler
        if threading.current_thread() is threading.main_thread():
            for sig in INTERRUPT_EXIT:  # before torch's agent starts the ranks (lint, rendezvous)
                signal.signal(sig, handler)

    def take_stacks(self) -> None:
        """The watcher stops deciding (an interrupted job gets no verdict on the user's code) and asks every
        probe for its stacks; never more than a couple of seconds."""
        w = self.watcher
        if w is None:
            return
        w.stopping.set()
        try:
            if w.lock.acquire(timeout=1.0):
                try:
                    w.read_states()
                    w.collect_stacks(1.5)
                finally:
                    w.lock.release()
        except Exception:
            pass

    def follower_loop(self) -> None:
        """On a node that does not host the store: stop when the host says so."""
        while not self.stop_requested.is_set():
            try:
                if self.store.check([side.STOP]):
                    self.stop()
                    return
            except Exception:
                pass
            time.sleep(0.3)

    # -- the run ---------------------------------------------------------------------
    def run(self) -> int:
        from ddp_doctor import launch
        from ddp_doctor.watcher import Watcher

        a = self.args
        self.hook_interrupts()
        lint_findings = self.lint_findings = _lint(a.training_script, a.module)
        is_host = self.open_store()
        run_dir = tempfile.mkdtemp(prefix="ddp-doctor-")
        os.environ["DDP_DOCTOR_STORE"] = self.store_addr
        if self.local is not None:
            os.environ["DDP_DOCTOR_NODE_LOCAL"] = "1"  # the ranks post under their local rank (probe.publisher)
        os.environ["DDP_DOCTOR_DIR"] = run_dir
        os.environ["DDP_DOCTOR_T0"] = repr(self.t0)
        os.environ["DDP_DOCTOR_LAUNCHER_PID"] = str(os.getpid())  # ranks die with this process (probe.lifeline)
        a.monitor_interval = max(float(a.monitor_interval), 1.0)  # let the watcher see an exit first
        self.watcher = Watcher(self.local or self.store, world_size=_world_size_hint(a), hang_timeout=self.hang_timeout,
                               run_dir=run_dir, is_host=is_host, on_decision=self.on_decision,
                               stop_on_stall=self.stop_on_stall, on_stall=self.on_stall,
                               max_restarts=int(a.max_restarts or 0), **self._hierarchy(is_host))
        self.watcher.start()
        if self.local is not None:  # the ranks sign with their node's secret (the root channels keep the job's)
            from ddp_doctor.channel import SECRET_ENV

            os.environ[SECRET_ENV] = self.node_secret
        if not is_host and self.local is None:
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
        self.watcher.gather_finals()  # several nodes: the nodes' last states meet at the root
        try:
            report = self.run_report(job_error, lint_findings, t_end)
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
                    view.update(assemble.live_rows(self.watcher))
                    w = self.watcher
                    stalled = w.stalls[-1] if w.stall_decision is not None and w.stalls else None
                    view.warn(w.judge.suspicion, stall=stalled)
        except Exception:
            pass

    def run_report(self, job_error, lint_findings, t_end) -> dict[str, Any]:
        return assemble.run_report(self, job_error, lint_findings, t_end)

    def emit(self, report: dict[str, Any], is_host: bool) -> int:
        return assemble.emit(self, report, is_host)


def _failures(e: BaseException) -> dict[int, ExitStatus]:
    """Exit status per global rank from torch's ChildFailedError."""
    out: dict[int, ExitStatus] = {}
    for rank, pf in (getattr(e, "failures", None) or {}).items():
        code = getattr(pf, "exitcode", None)
        sig = None
        if isinstance(code, int) and code < 0:
            try:
                sig = signal.Signals(-code).name
            except ValueError:
                sig = str(-code)
        out[int(rank)] = ExitStatus(code, sig)
    return out


def _is_local(host: str) -> bool:
    """Is ``host`` this machine (a name of it, or an address of one of its interfaces: Slurm's short names,
    a Kubernetes service of this pod)?"""
    import socket

    if host in ("localhost", "127.0.0.1", "::1", "0.0.0.0", socket.gethostname(), socket.getfqdn()):
        return True
    try:
        addr = socket.gethostbyname(host)
    except OSError:
        return False
    if addr.startswith("127."):
        return True
    try:
        import psutil

        return any(a.address == addr for nic in psutil.net_if_addrs().values() for a in nic)
    except Exception:
        return False

