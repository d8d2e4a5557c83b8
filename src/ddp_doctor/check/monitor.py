"""The launcher side of ``check``: host the node-local store, follow every rank, enforce deadlines.

:class:`Monitor` runs in a background thread of the ``ddp-doctor check`` process while
torch's elastic launcher runs in the main thread.  It reads what the ranks publish
(:mod:`.channel`), decides that a rank is stuck when it has been in one test longer than
the deadline plus the gate grace, tells the ranks to leave (``ack``), stops the stuck
ranks it started (by PID, after checking they are its own descendants), and returns a
snapshot for :mod:`.results` — whether the ranks finished, hung or died.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Any

from ddp_doctor.check import channel, plan
from ddp_doctor.check.worker import gate_grace
from ddp_doctor.procs import descendants, terminate


class Monitor:
    def __init__(self, deadline: float, startup_timeout: float, poll_s: float = 0.05,
                 rendezvous_timeout: float = 60.0) -> None:
        self.deadline = deadline
        self.rendezvous_timeout = rendezvous_timeout
        self.startup_timeout = startup_timeout
        self.poll_s = poll_s
        self.lstore = channel.host_store(timeout_s=10.0)
        self.address = f"127.0.0.1:{self.lstore.port}"
        self.gstore = None
        self.job_ended = threading.Event()
        self.job_error: str | None = None
        self.started_at = time.monotonic()
        self.snapshot: dict[str, Any] = {}
        self.finalized = threading.Event()
        # after the verdict, torch's agent may still wait for other nodes (its exit barrier waits
        # 300 s for a node whose ranks failed): the watchdog interrupts it after ``exit_grace_s``
        self.exit_grace_s = deadline + 15.0
        self.launch_returned = False
        self.watchdog_fired = False
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._loop, name="ddp-doctor-check-monitor", daemon=True)
        # cache
        self.master: dict[str, Any] | None = None
        self.data: dict[str, Any] = {}
        self.at_seen: dict[int, tuple[str, float]] = {}
        self.stuck: dict[int, str] = {}
        self.killed: list[dict[str, Any]] = []

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._thread.start()

    def job_finished(self, error: str | None = None) -> None:
        """Called by the main thread when torch's launcher returned or raised (the ranks' failures go
        straight into the snapshot the caller takes)."""
        self.job_error = error
        self.job_ended.set()

    def join(self, timeout: float | None = None) -> dict[str, Any]:
        self._thread.join(timeout)
        return self.snapshot

    # ------------------------------------------------------------------ reading
    def _get(self, key: str, remote_ok: bool = True) -> Any | None:
        value = channel.get(self.lstore, key)
        if value is None and remote_ok and self.gstore is not None:
            value = channel.get(self.gstore, key)
        return value

    def _connect_global(self) -> None:
        if self.gstore is not None or self.master is None:
            return
        if int(self.master.get("group_world_size", 1)) <= 1:
            return  # single node: every rank writes to the local store
        try:
            self.gstore = channel.connect(self.master["addr"], self.master["port"], timeout_s=5.0,
                                          prefix=channel.job_prefix(self.master["run_id"], self.master["restart"]))
        except Exception:  # noqa: BLE001 - not up yet (rank 0 hosts it when the agent does not)
            self.gstore = None

    def world_size(self) -> int | None:
        return int(self.master["world_size"]) if self.master else None

    def poll(self) -> None:
        if self.master is None:
            self.master = self._get("master", remote_ok=False)
        self._connect_global()
        n = self.world_size()
        if n is None:
            return
        d = self.data
        for r in range(n):
            for kind in ("started", "hello", "done"):
                key = f"{kind}/{r}"
                if key not in d:
                    value = self._get(key)
                    if value is not None:
                        d[key] = value
            at = self._get(f"at/{r}")
            if at is not None:
                d[f"at/{r}"] = at
                if self.at_seen.get(r, ("",))[0] != at["test"]:
                    self.at_seen[r] = (at["test"], time.monotonic())
            for test in plan.ALL_TESTS:
                key = f"res/{r}/{test}"
                if key not in d:
                    value = self._get(key)
                    if value is not None:
                        d[key] = value
        for g in range(int(self.master.get("group_world_size", 1))):
            key = f"audit/{g}"
            if key not in d:
                value = self._get(key)
                if value is not None:
                    d[key] = value
        if "stop" not in d:
            value = self._get("stop")
            if value is not None:
                d["stop"] = value

    # ------------------------------------------------------------------ deciding
    def _update_stuck(self) -> None:
        now = time.monotonic()
        for r, (test, since) in self.at_seen.items():
            if f"done/{r}" in self.data or f"res/{r}/{test}" in self.data:
                continue
            n, nodes = self.world_size() or 1, int((self.master or {}).get("group_world_size", 1))
            test_limit = self.rendezvous_timeout if test == "rendezvous" else plan.test_deadline(test, self.deadline, n, nodes)
            limit = test_limit + 2 * gate_grace(test_limit)
            if now - since > limit:
                self.stuck.setdefault(r, test)

    def _settled(self) -> bool:
        n = self.world_size()
        if n is None:
            return False
        return all(f"done/{r}" in self.data or r in self.stuck for r in range(n))

    def _hard_limit(self) -> float:
        return (self.startup_timeout + self.rendezvous_timeout
                + (len(plan.ALL_TESTS) + 2) * (self.deadline + 2 * gate_grace(self.deadline)))

    def _loop(self) -> None:
        try:
            while True:
                self.poll()
                self._update_stuck()
                if self.job_ended.is_set() or self._settled():
                    break
                elapsed = time.monotonic() - self.started_at
                if self.master is None and elapsed > self.startup_timeout:
                    self.job_error = self.job_error or f"no rank started within {self.startup_timeout:g} s"
                    break
                if elapsed > self._hard_limit():
                    self.job_error = self.job_error or f"check did not finish within {self._hard_limit():.0f} s"
                    break
                time.sleep(self.poll_s)
            self.poll()
            self._finish()
        finally:
            self.finalized.set()
        self._watchdog()

    def mark_launch_returned(self) -> None:
        with self._lock:
            self.launch_returned = True

    def _watchdog(self) -> None:
        """SIGTERM this process once, if torch's launcher is still waiting long after the verdict.

        The elastic agent turns SIGTERM into ``SignalException`` in the main thread (the
        ``launch`` call), after stopping its workers: ``run_check`` catches it and reports.
        """
        if self.job_ended.wait(self.exit_grace_s):
            return
        with self._lock:
            if self.launch_returned:
                return
            self.watchdog_fired = True
            self.snapshot["watchdog"] = f"launcher still waiting {self.exit_grace_s:g} s after the verdict: interrupted"
            os.kill(os.getpid(), signal.SIGTERM)

    def _finish(self) -> None:
        channel.Channel(self.lstore, self.gstore).set("ack", {"t": time.time()})
        # Stop the ranks of this node that are stuck or still running after the hard limit.
        local = [v for k, v in self.data.items() if k.startswith("started/")]
        to_stop = [s for s in local if s["rank"] in self.stuck
                   or (not self.job_ended.is_set() and f"done/{s['rank']}" not in self.data)]
        self.killed = stop_processes([s["pid"] for s in to_stop if "pid" in s])
        self.snapshot = {
            "master": self.master, "data": dict(self.data), "stuck": dict(self.stuck),
            "killed": self.killed, "job_error": self.job_error,
        }


def stop_processes(pids: list[int], grace_s: float = 3.0) -> list[dict[str, Any]]:
    """SIGTERM then SIGKILL each pid that is a descendant of this process; returns what was done."""
    mine = {p.pid: p for p in descendants()}
    how = terminate([mine[pid] for pid in pids if pid in mine], grace_s)
    return [{"pid": pid, "signal": h} for pid, h in how.items() if h != "gone"]


def stop_all_descendants(grace_s: float = 3.0) -> list[dict[str, Any]]:
    """Leave nothing behind: stop every process this one started that is still running."""
    return stop_processes([p.pid for p in descendants()], grace_s)
