"""The watcher: runs in the launcher process beside torch's elastic agent, and collects.

It reads every rank's state from the side-channel store (:mod:`ddp_doctor.store`) a few times a
second, notices local ranks' deaths before the agent reaps them, and asks :mod:`ddp_doctor.diagnose.live`
whether the job is lost.  Once it is, the watcher takes every rank's stack (the probe's thread, falling
back to faulthandler on SIGUSR1), the DataLoader workers' stacks and what each rank's training thread is
blocked in (``watcher.outside``: a socket's peer, a child process, a FIFO), and calls ``on_decision``; the
session stops the job and :mod:`ddp_doctor.diagnose` turns :meth:`Watcher.evidence` into findings.  A stall
(no rank showed a sign of life for the limit, nothing proven) is diagnosed the same way but is no stop: the
watcher keeps it (``stalls``), calls ``on_stall`` (the session writes and prints the diagnosis) and goes on
watching; ``on_stall`` is called again when the job moves again.

A rank failure that torch's agent will answer with a restart (``--max-restarts``) is not the end:
the watcher keeps that attempt's evidence in ``earlier`` and watches the restarted ranks afresh.
No verdict and no formatting here.

Every poll the watcher reduces its ranks' views to a node summary (``diagnose.summary``).  On a single
node it decides from that summary.  On several nodes each node's watcher reads only its own ranks (they
post to this node's store) and posts the summary to the root store (``uplink.Uplink``); the root node's
watcher reads every node's summary and decides (``root.Root``), pulling full states and stacks from the
nodes it suspects through the control message each node reads.
"""
from __future__ import annotations

import os
import threading
import time
from typing import Any, Callable

import psutil

from ddp_doctor import store as side
from ddp_doctor.diagnose import live as judge
from ddp_doctor.diagnose.jobview import JobView
from ddp_doctor.diagnose.summary import Summarizer, calm
from ddp_doctor.evidence import (ExitStatus, JobEvidence, NodeDetail, NodeSummary, RankState, Stall, Verdict,
                                 WorkerStack, stacks_from_wire)
from ddp_doctor.watcher import outside
from ddp_doctor.watcher.posts import RankPosts
from ddp_doctor.watcher.root import DETAIL_ALL
from ddp_doctor.watcher.stacks import FATAL, fatal_stack, parse_faulthandler, peek_exit, signal_dumps, tore_down
from ddp_doctor.watcher.views import RankView

__all__ = ["Watcher", "RankView", "FATAL", "POLL", "parse_faulthandler", "Attempt"]

POLL = 0.2
CALM_POLL = 1.0      # a single node whose ranks all progress (``summary.calm``): a full look this often
PULL_WAIT_S = 3.0    # the root of several nodes: how long it waits for the suspected nodes' stacks
FINALS_S = 10.0      # ... and at the end of the job for every node's last word
_HOST = __import__("socket").gethostname()


class Watcher(threading.Thread):
    """Poll the store, decide; ``on_decision(decision)`` is called once from this thread."""

    def __init__(self, store, *, world_size: int, hang_timeout: float | None, run_dir: str,
                 is_host: bool = True, on_decision: Callable[[Verdict], None] | None = None,
                 max_restarts: int = 0, local_world: int | None = None, uplink: Any = None, root: Any = None,
                 on_stop: Callable[[], None] | None = None, poll: float = 0.0, stop_on_stall: bool = False,
                 on_stall: Callable[[Verdict], None] | None = None) -> None:
        super().__init__(name="ddp-doctor-watch", daemon=True)
        self.store = store
        self.world_size = world_size
        self.judge = judge.Judge(hang_timeout, stop_on_stall)
        self.on_stall = on_stall      # a stall diagnosed (reason "stalled") or ended ("resumed"): the job runs on
        self.stalls: list[Stall] = []  # every stall of this attempt (the last one still on when lasted_s is None)
        self.stall_decision: Verdict | None = None  # the stall diagnosed now (None: the job is not stalled)
        self.run_dir = run_dir
        self.is_host = is_host
        self.on_decision = on_decision
        # several nodes: this node's ranks post under their local rank; their views appear as they do
        self.local_world = local_world
        self.views: dict[int, RankView] = {} if local_world else {r: RankView(r) for r in range(world_size)}
        self.uplink = uplink          # a node of several: its summaries to the root (watch.uplink)
        self.root = root              # the root of several nodes: every node's summary (watch.root)
        self.on_stop = on_stop        # a node of several: the root stopped the job
        self.stop_ordered = False     # a node of several: the root ordered the stop (exits after it are ours)
        self.poll = poll or POLL      # seconds between polls (several nodes: root.interval_for the nodes)
        self.summarizer = Summarizer(digests=uplink is not None or root is not None)
        self.node_summary: NodeSummary | None = None
        self.job: JobView | None = None
        self.decision: Verdict | None = None
        self.stopping = threading.Event()
        self.started = time.monotonic()
        self.first_state_t: float | None = None
        self.req = 0
        self.lock = threading.Lock()
        self.local_pids: dict[int, int] = {}   # pid -> rank (this node's ranks)
        self.posts = RankPosts(store)          # the ranks' posts: read, decoded
        self.last_raw = self.posts.last_raw    # key -> the post last read (read once, however often polled)
        self.decoders = self.posts.decoders    # key -> its rank's base and what its deltas added
        self.news = 0                          # the ranks' NEWS counter at the last look
        self.exit_posted: set[int] = set()
        self.acked: set[int] = set()
        self.attempt = 0                     # torch's restart count of the ranks being watched
        self.restarts_left = max_restarts
        self.failed_attempt: Verdict | None = None  # the decision awaiting torch's restart
        self.earlier: list[Attempt] = []  # per failed attempt

    # -- reading -------------------------------------------------------------------
    def _get(self, key: str) -> str | None:
        raw = self.posts.peek(key)
        return None if raw is None else raw.decode()

    def read_states(self) -> None:
        now = time.monotonic()
        if self.local_world:
            keys = [(side.local_key(i), None) for i in range(self.local_world)]
        else:
            keys = [(side.rank_key(r), r) for r in range(self.world_size)]
        for (key, r), raw in zip(keys, self.posts.read([k for k, _ in keys])):
            if raw is None or raw == self.last_raw.get(key):
                continue
            self.last_raw[key] = raw
            state = self.posts.state_of(key, raw)
            if state is None:
                continue
            r = state.rank if r is None else r
            attempt = state.attempt
            if attempt < self.attempt:
                continue  # the failed attempt's last word; its successor has not posted yet
            if attempt > self.attempt:
                self.begin_attempt(attempt)
                now = time.monotonic()
            if self.first_state_t is None:
                self.first_state_t = now
            ws = state.world_size
            if isinstance(ws, int) and ws > self.world_size:
                if not self.local_world:
                    for k in range(self.world_size, ws):
                        self.views[k] = RankView(k)
                self.world_size = ws
                if self.root is not None:
                    self.root.world_size = ws
            if r not in self.views:
                self.views[r] = RankView(r)
            self.views[r].update(state, now)
            if state.host == _HOST and state.pid:
                self.local_pids[state.pid] = r

    def check_local_exits(self) -> None:
        """Notice a local rank's death before the agent reaps it (waitid WNOWAIT keeps the zombie).  Only
        the pids the ranks posted are asked (``peek_exit`` answers for this process's children only):
        scanning /proc for children every poll cost the watcher more than everything else it does.  Once the
        root ordered the stop, a rank's end is the stop's doing, no fact about the job (the root's diagnosis
        would read it as a rank gone while the others wait): not noted."""
        if self.stop_ordered:
            return
        for pid, rank in list(self.local_pids.items()):
            if rank in self.exit_posted:
                continue
            info = peek_exit(pid)
            if info is None:
                continue
            self.exit_posted.add(rank)
            self.views[rank].exit = info
            if info.signal in FATAL:
                self.views[rank].stack = fatal_stack(self.run_dir, pid)

    def begin_attempt(self, attempt: int) -> None:
        """torch's agent restarted the ranks: keep the failed attempt's evidence, watch the new ones afresh."""
        self.earlier.append(Attempt(self.attempt, self.evidence(), self.failed_attempt or Verdict("exit")))
        self.attempt = attempt
        self.failed_attempt = None
        self.views = {} if self.local_world else {r: RankView(r) for r in range(self.world_size)}
        self.local_pids.clear()
        self.last_raw.clear()
        self.exit_posted.clear()
        self.acked.clear()
        self.first_state_t = None
        self.judge = judge.Judge(self.judge.hang_timeout, self.judge.stop_on_stall)
        self.stalls, self.stall_decision = [], None
        self.summarizer.compared.clear()  # the new attempt's positions start again at 0
        if self.root is not None:
            self.root.begin_attempt(attempt)

    # -- stacks --------------------------------------------------------------------
    def collect_stacks(self, wait_s: float = 1.5) -> None:
        """Ask every probe for its stacks; faulthandler (SIGUSR1) for local ranks that do not answer."""
        try:
            self.req = self.store.add(side.REQ, 1)
        except Exception:
            return
        pending = {r for r, v in self.views.items() if v.state and not v.exit and not v.state.done
                   and not v.state.exc and not v.remote}  # (another node's ranks: its agent takes theirs)
        end = time.monotonic() + wait_s
        while pending and time.monotonic() < end:
            for r in list(pending):
                raw = self._get(side.stack_key(r, self.req))
                if raw:
                    threads = stacks_from_wire(raw)
                    v = self.views[r]
                    v.threads = threads
                    v.stack = next((t.frames for t in threads if t.main), ())
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
            if v.state is None or v.state.host != _HOST or v.remote:
                continue
            pids = {p for ld in v.state.loaders for p in ld.worker_pids}
            if pid_of.get(r):
                try:
                    pids |= {c.pid for c in psutil.Process(pid_of[r]).children()}
                except psutil.Error:
                    pass
            for wp in sorted(pids):
                if os.path.exists(side.stack_file(self.run_dir, "worker", wp)):
                    wanted.append((wp, "worker", r))
        dumps = signal_dumps(self.run_dir, [(pid, kind) for pid, kind, _ in wanted])
        self.read_outside(pid_of)
        for v in self.views.values():
            if not v.remote:
                v.workers = []
        for pid, kind, r in wanted:
            frames = tuple(dumps.get(pid) or ())
            if kind == "rank":
                if frames:
                    self.views[r].stack = frames
            else:
                self.views[r].workers.append(WorkerStack(pid, frames, outside.frozen_forever(pid)))

    def read_outside(self, pid_of: dict[int, int]) -> None:
        """What each local live rank's training thread is blocked in, and on what (``watcher.outside``)."""
        for r, v in self.views.items():
            st = v.state
            if v.remote or st is None or st.done or st.exc or v.exit or not pid_of.get(r):
                continue
            tid = st.activity.tid if st.activity is not None else None
            workers = frozenset(p for ld in st.loaders for p in ld.worker_pids)
            v.outside = None if st.in_collective else outside.blocked_on(pid_of[r], tid, workers)

    def watch_queues(self, now: float) -> None:
        """A local rank quiet for a while and blocked on a socket: its queues moving (the peer reads what it
        sends, or sends to it) are a sign of life, though its thread's CPU, I/O counters and stack stay flat
        (one long ``sendall``)."""
        for pid, r in self.local_pids.items():
            v = self.views.get(r)
            st = v.state if v is not None else None
            if st is None or v.remote or st.done or st.exc or v.exit or st.in_collective \
                    or v.idle_s(now) < outside.QUIET_S:
                continue
            v.note_queues(outside.queues(pid, st.activity.tid if st.activity is not None else None), now)

    # -- loop: read, ask diagnose.live, collect ------------------------------------
    def poll_once(self) -> Verdict | None:
        with self.lock:
            self.read_states()
            self.check_local_exits()
            now = time.monotonic()
            self.watch_queues(now)
            node = self.summarizer.summary(self.views, now, first_state_t=self.first_state_t, host=_HOST)
            self.node_summary = node
            if self.uplink is not None:  # a node of several: tell the root, do what it asks
                self.uplink.post(node, now)
                self._obey(self.uplink.control())
                return None
            if self.root is not None:    # the root of several: every node's summary
                node = node.with_(node=self.root.slot)
                self.root.read(now)
                self.root.own(node)
                self.job = self.root.job_view(node, now)  # (summaries of this attempt only)
                self.root.suspect_cycles(self.job)
                self.root.confirm(self.views, now)
            elif self.is_host:
                self.job = JobView(self.world_size, [(node, 0.0)])
            if not self.is_host or self.failed_attempt is not None:
                return None  # (a failed attempt: nothing to decide until torch's agent restarts the ranks)
            if getattr(self.store, "lost", False) is True:
                return None  # the hosted channel is gone for good (tampered with): stale states decide nothing
            return self.judge.decide_job(self.job, now)

    def _obey(self, ctl) -> None:
        """A node of several: answer the root's pull (stacks first when asked), stop when it says so."""
        if ctl is None:
            return
        pull = self.uplink.pull_for_me(ctl)
        if pull is not None:
            if pull.stacks:
                self.collect_stacks()
                self.ack_all()
            self.uplink.answer(self.node_detail(pull.req))
        if ctl.stop and self.on_stop is not None and not self.stopping.is_set():
            self.stop_ordered = True
            self.on_stop()

    def node_detail(self, req: int, final: bool = False) -> NodeDetail:
        """This node's ranks' full states, for the root (``req`` 0 and ``final``: the last word)."""
        ev = self.evidence()
        return NodeDetail(self.uplink.slot if self.uplink is not None else 0, req, _HOST,
                          tuple(st for st in ev.ranks.values() if not st.missing), final, _t0())

    def run(self) -> None:
        self._watch()
        if self.decision is None and self.failed_attempt is not None:
            self.decision = self.failed_attempt  # the job ended without the restart torch's agent owed us

    def settle(self, failures: dict[int, ExitStatus]) -> Verdict | None:
        """The last word once the job has ended, decided here once: when the live decision was none or a
        failure, a mismatch the final states show (ranks that failed together inside one collective); then
        the exits torch's agent reaped before this watcher saw them (and a fatal signal's stack)."""
        d = self.decision
        # a channel lost for good (tampered with): the states stopped coming, a desync read from them is stale
        blind = getattr(self.store, "lost", False) is True
        if not blind and (d is None or (d.reason == "exit" and not d.finished)):
            try:
                late = judge.find_desync(self.views, self.world_size)
            except Exception:  # noqa: BLE001 - the live decision stands
                late = None
            if late is not None:  # a desync replaces an exit's story, keeping its timing
                self.decision = late if d is None else d.with_(
                    reason=late.reason, kind=late.kind, group=late.group, seq=late.seq, calls=late.calls,
                    parted=late.parted)
        for r, info in failures.items():
            v = self.views.get(r)
            if v is not None and v.state and not v.exit:
                v.exit = info
                if info.signal in FATAL and not v.stack and v.state.pid:
                    v.stack = tuple(fatal_stack(self.run_dir, v.state.pid))
        return self.decision

    def interval(self) -> float:
        """Seconds between full looks: ``CALM_POLL`` while a single node's job is calm, else ``poll``.
        Each look costs the ranks' CPU on a shared machine; a job that needs watching is looked at often."""
        node = self.node_summary
        if self.uplink is not None or self.root is not None or node is None or self.judge.suspicion is not None:
            return self.poll
        return max(self.poll, CALM_POLL) if calm(node, self.world_size) else self.poll

    def _news(self) -> bool:
        """Has a rank posted at once since the last look (``store.NEWS``: a collective at a new line)?"""
        try:
            n = self.store.add(side.NEWS, 0)
        except Exception:
            return True
        news, self.news = n != self.news, n
        return news

    def _watch(self) -> None:
        last = float("-inf")
        while not self.stopping.is_set():
            decision = None
            try:
                exits = len(self.exit_posted)
                with self.lock:
                    self.check_local_exits()  # every poll: torch's agent reaps a dead rank within its interval
                due = time.monotonic() - last >= self.interval() - 1e-3
                if self._news() or len(self.exit_posted) > exits or due:
                    last = time.monotonic()
                    decision = self.poll_once()
            except Exception as e:  # the watcher must not die silently
                print(f"ddp-doctor: watcher error: {e!r}")
            if decision is not None and not judge.stops(decision):
                decision = self.stall_event(decision)  # a stop only when the stall's facts prove it
            if decision is not None and self.decision is None:
                failed = judge.any_failed(self.views) or bool(self.job is not None and self.job.failed)
                decision = decision.with_(t_detect=time.monotonic(), failed=failed)
                with self.lock:
                    self.collect_everything(decision)
                decision = decision.with_(t_stacks=time.monotonic(), attempt=self.attempt)
                if decision.reason == "exit" and not decision.finished and self.restarts_left > 0:
                    # torch's agent restarts every rank after a failure: keep watching the next attempt
                    self.restarts_left -= 1
                    self.failed_attempt = decision
                    continue
                if decision.reason == "desync" and decision.calls:
                    decision = decision.with_(blocked=judge.blocked_at(decision, self.views))
                self.decision = decision
                if self.on_decision is not None:
                    self.on_decision(decision)
                return
            self.stopping.wait(self.poll)

    def stall_event(self, decision: Verdict) -> Verdict | None:
        """A stall (no rank showed a sign of life for the limit, nothing proven yet): take every stack and what
        each rank is blocked on; when they prove that a rank can never resume (``live.stall_proof``) that is
        the decision to stop; else keep the stall, tell the session, and the job runs on.  Its end
        ("resumed"): how long it lasted."""
        if decision.reason == "stalled":
            decision = decision.with_(t_detect=time.monotonic())
            with self.lock:
                self.collect_everything(decision)
                ev = self.evidence()
            proof = judge.stall_proof(ev, decision)
            if proof is not None:
                return proof
            decision = decision.with_(t_stacks=time.monotonic(), attempt=self.attempt)
            self.stall_decision = decision
            self.stalls.append(outside.stall_record(ev, decision, _t0()))
        elif self.stalls and self.stalls[-1].lasted_s is None:
            self.stalls[-1] = self.stalls[-1].with_(lasted_s=decision.stalled_s)
            self.stall_decision = None
        if self.on_stall is not None:
            try:
                self.on_stall(decision)
            except Exception as e:  # a report that could not be written must not end the watching
                print(f"ddp-doctor: could not report the stall: {e!r}")
        return None

    def collect_everything(self, decision: Verdict) -> None:
        """Once decided: every local rank's stacks; the root of several nodes asks the suspected nodes (every
        node of a small job) for theirs and their ranks' full states at the same time."""
        pulled: set[int] = set()
        if self.root is not None and self.job is not None:
            pulled = self.root.suspected(decision, self.job)
            if pulled:  # (a tree's leaders ask only their nodes that hold the ranks wanted)
                self.root.request(pulled, stacks=True, ranks=self.root.suspected_ranks(decision, self.job))
        self.collect_stacks()
        self.ack_all()
        if pulled:
            missing = self.root.wait(pulled, PULL_WAIT_S)
            self.root.mark_silent(missing, time.monotonic())
            self.take_remote()

    def take_remote(self) -> None:
        """The full states other nodes sent (the root of several nodes): into the views, local ones first."""
        if self.root is None:
            return
        for r, v in self.root.remote_views(time.monotonic()).items():
            if r not in self.views or self.views[r].state is None or self.views[r].remote:
                self.views[r] = v

    def gather_finals(self, timeout_s: float = FINALS_S) -> None:
        """The end of the job.  The root of several nodes: every node's last word (a small job: the report
        shows every rank); a node of several: post its own."""
        try:
            if self.root is not None and self.world_size <= DETAIL_ALL:
                self.root.finals(timeout_s)
                self.take_remote()
            elif self.uplink is not None and self.world_size <= DETAIL_ALL:
                self.uplink.answer(self.node_detail(0, final=True))
        except Exception as e:  # never let the end of the job fail on the side channel
            print(f"ddp-doctor: could not exchange the nodes' final states: {e!r}")

    def ack_all(self) -> None:
        for r, v in self.views.items():
            if v.state is not None and v.state.exc and r not in self.acked and not v.remote:
                try:
                    self.store.add(side.ack_key(self.attempt, r), 1)
                    self.acked.add(r)
                except Exception:
                    pass

    def evidence(self) -> JobEvidence:
        """Everything diagnose() needs: each rank's last state plus what only this side knows."""
        ranks: dict[int, RankState] = {}
        now = time.monotonic()
        for r, v in self.views.items():
            if v.state is None:
                ranks[r] = RankState(rank=r, missing=True, exit=v.exit, stack=tuple(v.stack),
                                     workers=tuple(v.workers))
                continue
            stack, fatal = tuple(v.stack), False  # (read, never written back: a getter does not change the views)
            if not stack and v.exit and v.exit.signal in FATAL and v.state.pid and not v.remote:
                stack = tuple(fatal_stack(self.run_dir, v.state.pid))
                fatal = bool(stack)
            teardown = v.state.teardown or bool(v.exit and v.exit.signal in FATAL and v.state.pid and not v.remote
                                                and tore_down(self.run_dir, v.state.pid))
            ranks[r] = v.state.with_(teardown=teardown, stack=stack, threads=tuple(v.threads), workers=tuple(v.workers),
                                     exit=v.exit, busy=v.busy(), stalled_s=round(now - v.progress_t, 2),
                                     idle_s=round(v.idle_s(now), 2), outside=v.outside or v.state.outside,
                                     sites_seen=frozenset(v.sites_seen), fatal_stack=fatal)
        lost: tuple = ()
        if self.root is not None:  # ranks no full state came for: what their node's summary says
            light = self.root.light_states()
            for r in range(self.world_size):
                if r not in ranks or ranks[r].missing:
                    ranks[r] = light.get(r) or ranks.get(r) or RankState(rank=r, missing=True)
            lost = tuple(self.root.lost.values())
        limit, how = self.judge.hang_limit(self.views)
        return JobEvidence(self.world_size, dict(sorted(ranks.items())), round(now - self.started, 3), limit, how,
                           suspicion=self.judge.longest, lost_nodes=lost, stalls=tuple(self.stalls))


def _t0() -> float | None:
    """The wall-clock start this launcher's ranks count their times from (``DDP_DOCTOR_T0``)."""
    try:
        return float(os.environ.get("DDP_DOCTOR_T0") or "") or None
    except ValueError:
        return None


class Attempt:
    """A failed attempt torch's agent restarted (``--max-restarts``): its evidence and live verdict."""

    def __init__(self, attempt: int, evidence: JobEvidence, decision: Verdict) -> None:
        self.attempt = attempt
        self.evidence = evidence
        self.decision = decision
