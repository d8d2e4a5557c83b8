"""The watcher: runs in the launcher process beside torch's elastic agent, and collects.

It reads every rank's state from the side-channel store (:mod:`ddp_doctor.channel`) a few times a
second, notices local ranks' deaths before the agent reaps them, and asks :mod:`ddp_doctor.diagnose.live`
whether the job is lost.  Once it is, the watcher takes every rank's stack (the probe's thread, falling
back to faulthandler on SIGUSR1) and the DataLoader workers' stacks, and calls ``on_decision``; the
session stops the job and :mod:`ddp_doctor.diagnose` turns :meth:`Watcher.evidence` into findings.

A rank failure that torch's agent will answer with a restart (``--max-restarts``) is not the end:
the watcher keeps that attempt's evidence in ``earlier`` and watches the restarted ranks afresh.
No verdict and no formatting here.
"""
from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, Callable

import psutil

from ddp_doctor import channel
from ddp_doctor.diagnose import live as judge
from ddp_doctor.watch.stacks import FATAL, fatal_stack, parse_faulthandler, peek_exit, signal_dumps
from ddp_doctor.watch.views import RankView, site_key

__all__ = ["Watcher", "RankView", "FATAL", "POLL", "parse_faulthandler", "site_key"]

POLL = 0.2
_HOST = __import__("socket").gethostname()


class Watcher(threading.Thread):
    """Poll the store, decide; ``on_decision(decision)`` is called once from this thread."""

    def __init__(self, store, *, world_size: int, hang_timeout: float | None, run_dir: str,
                 is_host: bool = True, on_decision: Callable[[dict], None] | None = None,
                 max_restarts: int = 0) -> None:
        super().__init__(name="ddp-doctor-watch", daemon=True)
        self.store = store
        self.world_size = world_size
        self.judge = judge.Judge(hang_timeout)
        self.run_dir = run_dir
        self.is_host = is_host
        self.on_decision = on_decision
        self.views: dict[int, RankView] = {r: RankView(r) for r in range(world_size)}
        self.decision: dict[str, Any] | None = None
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self.first_state_t: float | None = None
        self.req = 0
        self.lock = threading.Lock()
        self.local_pids: dict[int, int] = {}   # pid -> rank (this node's ranks)
        self.exit_posted: set[int] = set()
        self.acked: set[int] = set()
        self.attempt = 0                     # torch's restart count of the ranks being watched
        self.restarts_left = max_restarts
        self.failed_attempt: dict[str, Any] | None = None  # the decision awaiting torch's restart
        self.earlier: list[dict[str, Any]] = []  # {"attempt", "decision", "evidence"} per failed attempt

    # -- reading -------------------------------------------------------------------
    def _get(self, key: str) -> str | None:
        try:
            if not self.store.check([key]):
                return None
            return self.store.get(key).decode()
        except Exception:
            return None

    def read_states(self) -> None:
        now = time.monotonic()
        for r in range(self.world_size):
            raw = self._get(channel.rank_key(r))
            if raw is None:
                continue
            try:
                state = json.loads(raw)
            except ValueError:
                continue
            attempt = int(state.get("attempt") or 0)
            if attempt < self.attempt:
                continue  # the failed attempt's last word; its successor has not posted yet
            if attempt > self.attempt:
                self.begin_attempt(attempt)
                now = time.monotonic()
            if self.first_state_t is None:
                self.first_state_t = now
            ws = state.get("world_size")
            if isinstance(ws, int) and ws > self.world_size:
                for k in range(self.world_size, ws):
                    self.views[k] = RankView(k)
                self.world_size = ws
            self.views[r].update(state, now)
            if state.get("host") == _HOST and state.get("pid"):
                self.local_pids[state["pid"]] = r
        for r, v in self.views.items():
            if v.exit is None:
                raw = self._get(channel.exit_key(self.attempt, r))
                if raw:
                    v.exit = json.loads(raw)

    def check_local_exits(self) -> None:
        """Notice a local rank's death before the agent reaps it (waitid WNOWAIT keeps the zombie)."""
        me = psutil.Process()
        try:
            children = me.children()
        except psutil.Error:
            return
        for child in children:
            try:
                if "ddp_doctor.probe" not in " ".join(child.cmdline()) and child.pid not in self.local_pids:
                    continue
            except psutil.Error:
                pass
            rank = self.local_pids.get(child.pid)
            if rank is None or rank in self.exit_posted:
                continue
            info = peek_exit(child.pid)
            if info is None:
                continue
            self.exit_posted.add(rank)
            try:
                self.store.set(channel.exit_key(self.attempt, rank), json.dumps(info))
            except Exception:
                pass
            self.views[rank].exit = info
            if info.get("signal") in FATAL:
                self.views[rank].stack = fatal_stack(self.run_dir, child.pid)

    def begin_attempt(self, attempt: int) -> None:
        """torch's agent restarted the ranks: keep the failed attempt's evidence, watch the new ones afresh."""
        self.earlier.append({"attempt": self.attempt, "evidence": self.evidence(),
                             "decision": self.failed_attempt or {"reason": "exit"}})
        self.attempt = attempt
        self.failed_attempt = None
        self.views = {r: RankView(r) for r in range(self.world_size)}
        self.local_pids.clear()
        self.exit_posted.clear()
        self.acked.clear()
        self.first_state_t = None
        self.judge = judge.Judge(self.judge.hang_timeout)

    # -- stacks --------------------------------------------------------------------
    def collect_stacks(self, wait_s: float = 1.5) -> None:
        """Ask every probe for its stacks; faulthandler (SIGUSR1) for local ranks that do not answer."""
        try:
            self.req = self.store.add(channel.REQ, 1)
        except Exception:
            return
        pending = {r for r, v in self.views.items() if v.state and not v.exit and not (v.state or {}).get("done")
                   and not (v.state or {}).get("exc")}
        end = time.monotonic() + wait_s
        while pending and time.monotonic() < end:
            for r in list(pending):
                raw = self._get(channel.stack_key(r, self.req))
                if raw:
                    threads = json.loads(raw).get("threads", [])
                    v = self.views[r]
                    v.threads = threads
                    v.stack = next((t["frames"] for t in threads if t.get("main")), [])
                    pending.discard(r)
            time.sleep(0.05)
        self.read_states()
        # fall back to faulthandler for silent local ranks; and the workers' stacks (all signalled at once)
        pid_of = {r: pid for pid, r in self.local_pids.items()}
        wanted: list[tuple[int, str, int]] = []  # (pid, kind, rank)
        for r in pending:
            if pid_of.get(r):
                wanted.append((pid_of[r], "rank", r))
        for r, v in self.views.items():
            if (v.state or {}).get("host") != _HOST:
                continue
            pids = {p for ld in (v.state or {}).get("loaders", []) for p in ld.get("worker_pids", [])}
            if pid_of.get(r):
                try:
                    pids |= {c.pid for c in psutil.Process(pid_of[r]).children()}
                except psutil.Error:
                    pass
            for wp in sorted(pids):
                if os.path.exists(os.path.join(self.run_dir, f"worker-{wp}.stack")):
                    wanted.append((wp, "worker", r))
        dumps = signal_dumps(self.run_dir, [(pid, kind) for pid, kind, _ in wanted])
        for r in self.views:
            self.views[r].workers = []
        for pid, kind, r in wanted:
            frames = dumps.get(pid) or []
            if kind == "rank":
                if frames:
                    self.views[r].stack = frames
            else:
                self.views[r].workers.append({"pid": pid, "stack": frames})

    # -- loop: read, ask diagnose.live, collect ------------------------------------
    def poll_once(self) -> dict[str, Any] | None:
        with self.lock:
            self.read_states()
            self.check_local_exits()
            if not self.is_host or self.failed_attempt is not None:
                return None  # (a failed attempt: nothing to decide until torch's agent restarts the ranks)
            return self.judge.decide(self.views, self.world_size, self.first_state_t)

    def run(self) -> None:
        self._watch()
        if self.decision is None and self.failed_attempt is not None:
            self.decision = self.failed_attempt  # the job ended without the restart torch's agent owed us

    def _watch(self) -> None:
        while not self.stopping.is_set():
            try:
                decision = self.poll_once()
            except Exception as e:  # the watcher must not die silently
                decision = None
                print(f"ddp-doctor: watcher error: {e!r}")
            if decision is not None and self.decision is None:
                decision["t_detect"] = time.monotonic()
                # failures after this moment are consequences of the stop, not the verdict
                decision["failed"] = judge.any_failed(self.views)
                with self.lock:
                    self.collect_stacks()
                    self.ack_all()
                decision["t_stacks"] = time.monotonic()
                decision["attempt"] = self.attempt
                if decision.get("reason") == "exit" and not decision.get("finished") and self.restarts_left > 0:
                    # torch's agent restarts every rank after a failure: keep watching the next attempt
                    self.restarts_left -= 1
                    self.failed_attempt = decision
                    continue
                if decision.get("reason") == "desync" and "calls" in decision:
                    # still blocked at the mismatch -> the job hangs; moved on -> gloo paired them silently
                    decision["blocked"] = judge.blocked_at(decision, self.views)
                self.decision = decision
                if self.on_decision is not None:
                    self.on_decision(decision)
                return
            self.stopping.wait(POLL)

    def ack_all(self) -> None:
        for r, v in self.views.items():
            if (v.state or {}).get("exc") and r not in self.acked:
                try:
                    self.store.add(channel.ack_key(self.attempt, r), 1)
                    self.acked.add(r)
                except Exception:
                    pass

    def evidence(self) -> dict[str, Any]:
        """Everything diagnose() needs, as plain data (BOARD.md: PER-RANK EVIDENCE FORMAT)."""
        ranks: dict[int, dict[str, Any]] = {}
        for r, v in self.views.items():
            st = dict(v.state or {"rank": r, "missing": True})
            if not v.stack and (v.exit or {}).get("signal") in FATAL and st.get("pid"):
                v.stack = fatal_stack(self.run_dir, st["pid"])
                st["fatal_stack"] = bool(v.stack)
            st["stack"] = v.stack
            st["threads"] = v.threads
            st["workers"] = v.workers
            st["exit"] = v.exit
            st["busy"] = v.busy() if v.state else False
            st["stalled_s"] = round(time.monotonic() - v.progress_t, 2)
            st["sites_seen"] = sorted([op, list(s) if s else None] for op, s in v.sites_seen)
            ranks[r] = st
        limit, how = self.judge.hang_limit(self.views)
        return {"world_size": self.world_size, "wall_s": round(time.monotonic() - self.started, 3),
                "ranks": ranks, "hang_limit_s": limit, "hang_limit_how": how}


