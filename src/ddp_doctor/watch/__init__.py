"""The watcher: runs in the launcher process beside torch's elastic agent.

It hosts (or joins) the side-channel TCPStore the probes publish to, reads every
rank's state a few times a second, and decides when the job is lost:

- ``exit``   a rank raised, was killed by a signal, or finished while others wait;
- ``desync`` ranks' collective fingerprints disagree at the same sequence number,
             or their step counts per epoch differ (even while gloo still pairs them);
- ``hang``   no rank progressed for the hang limit (adaptive unless ``--hang-timeout``).

A rank failure that torch's agent will answer with a restart (``--max-restarts``) is not the end:
the watcher keeps that attempt's evidence in ``earlier`` and watches the restarted ranks afresh.

Then it collects every rank's stack (the probe's thread, falling back to
faulthandler on SIGUSR1) and the DataLoader workers' stacks, and hands the
evidence to ``ddp_doctor.diagnose``; the caller stops the job.  No formatting here.
"""
from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from datetime import timedelta
from typing import Any, Callable

import psutil

POLL = 0.2
FATAL = ("SIGABRT", "SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL")
FLOOR_S = 5.0            # adaptive hang limit never below this
FIRST_STEP_S = 10.0      # idle limit before the job's step time is known
BUSY_S = 300.0           # allowance while a rank is busy outside collectives (checkpoint, eval)
K_STEP = 10.0            # adaptive limit = K_STEP x p90 of recent step times
EXIT_GRACE_S = 3.0       # a rank finished; the others stall this long -> exit verdict


def host_store(port: int = 0):
    """Host the side-channel TCPStore (values signed with the job's secret); returns (channel, port)."""
    import torch.distributed as dist

    from ddp_doctor.channel import SideChannel, job_secret

    store = dist.TCPStore("0.0.0.0", port, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30))
    return SideChannel(store, secret=job_secret()), store.port


def join_store(host: str, port: int, timeout_s: float = 60.0):
    """Join another node's side channel; returns at once (connects in the background, calls never block)."""
    import torch.distributed as dist

    from ddp_doctor.channel import SideChannel, job_secret

    def connect():
        return dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                             timeout=timedelta(seconds=timeout_s))

    return SideChannel(connect=connect, secret=job_secret(), deadline=2.0, give_up_s=timeout_s)


def _p(values: list[float], q: float) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(q * (len(v) - 1) + 0.5))] if v else 0.0


def site_key(site) -> tuple | None:
    """Sites compare by file name, line and function (paths differ between nodes)."""
    if not site:
        return None
    if isinstance(site, dict):
        return (os.path.basename(site["path"]), site["line"], site.get("function"))
    return (os.path.basename(site[0]), site[1], site[2])


class RankView:
    """What the watcher knows of one rank across polls."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.state: dict[str, Any] | None = None
        self.progress = -1
        self.progress_t = time.monotonic()
        self.samples: list[tuple[float, float, Any]] = []  # (t, cpu_s, where)
        self.fps: dict[tuple[str, int], tuple] = {}  # (group, seq) -> (op, shapes, dtypes, site_key, epoch, step, site)
        self.sites_seen: set[tuple] = set()            # (op, site_key)
        self.exit: dict[str, Any] | None = None          # {"exit_code", "signal"} once gone
        self.stack: list[dict] = []
        self.threads: list[dict] = []
        self.workers: list[dict] = []

    def update(self, state: dict[str, Any], now: float) -> None:
        if "timeline" not in state and self.state and "timeline" in self.state:
            state["timeline"] = self.state["timeline"]  # periodic states omit it; keep the last full one
        self.state = state
        if state.get("progress", 0) != self.progress:
            self.progress = state.get("progress", 0)
            self.progress_t = now
        self.samples.append((now, state.get("cpu_s", 0.0), json.dumps(state.get("where"))))
        self.samples = [s for s in self.samples if now - s[0] <= 3.0]
        sites = state.get("sites") or []

        def sk(i):
            return site_key(sites[i]) if i is not None and i < len(sites) else None

        for g, seq, op, shapes, dtypes, si, ep, st in state.get("fingerprints") or []:
            s = sites[si] if si is not None and si < len(sites) else None
            self.fps[(g, seq)] = (op, tuple(shapes), tuple(dtypes), sk(si), ep, st,
                                  None if s is None else {"path": s[0], "line": s[1], "function": s[2]})
        if len(self.fps) > 4000:
            for k in sorted(self.fps, key=lambda k: k[1])[: len(self.fps) - 3000]:
                del self.fps[k]
        for op, si, _n in state.get("site_counts") or []:
            self.sites_seen.add((op, sk(si)))

    def started(self) -> bool:
        """Has this rank begun distributed work (a collective, DDP, a batch)?  Imports don't count."""
        st = self.state or {}
        return bool(st.get("progress") or st.get("seq") or st.get("in_collective"))

    def busy(self) -> bool:
        """Working outside collectives: CPU time grows, or its Python line changes."""
        st = self.state or {}
        if st.get("done") or self.exit:
            return False
        # (a rank inside a collective counts too: DDP's construction, forward and backward compute
        # inside them, and a rank that truly waits in gloo burns no CPU)
        if len(self.samples) < 2:
            return False
        (t0, c0, w0), (t1, c1, w1) = self.samples[0], self.samples[-1]
        if t1 - t0 < 0.5:
            return False
        if (c1 - c0) / (t1 - t0) > 0.05:
            return True
        if st.get("in_collective"):
            return False  # its line cannot change while it waits
        return any(w != w0 for _, _, w in self.samples)


class Watcher(threading.Thread):
    """Poll the store, decide; ``on_decision(decision)`` is called once from this thread."""

    def __init__(self, store, *, world_size: int, hang_timeout: float | None, run_dir: str,
                 is_host: bool = True, on_decision: Callable[[dict], None] | None = None,
                 max_restarts: int = 0) -> None:
        super().__init__(name="ddp-doctor-watch", daemon=True)
        self.store = store
        self.world_size = world_size
        self.hang_timeout = hang_timeout
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
        self.last_limit = 0.0
        self.not_started_since: float | None = None
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
            raw = self._get(f"ddpd/rank/{r}")
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
                raw = self._get(f"ddpd/exit/{self.attempt}/{r}")
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
            info = _peek_exit(child.pid)
            if info is None:
                continue
            self.exit_posted.add(rank)
            try:
                self.store.set(f"ddpd/exit/{self.attempt}/{rank}", json.dumps(info))
            except Exception:
                pass
            self.views[rank].exit = info
            if info.get("signal") in FATAL:
                self.views[rank].stack = self.fatal_stack(child.pid)

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
        self.not_started_since = None

    # -- stacks --------------------------------------------------------------------
    def collect_stacks(self, wait_s: float = 1.5) -> None:
        """Ask every probe for its stacks; faulthandler (SIGUSR1) for local ranks that do not answer."""
        try:
            self.req = self.store.add("ddpd/req", 1)
        except Exception:
            return
        pending = {r for r, v in self.views.items() if v.state and not v.exit and not (v.state or {}).get("done")
                   and not (v.state or {}).get("exc")}
        end = time.monotonic() + wait_s
        while pending and time.monotonic() < end:
            for r in list(pending):
                raw = self._get(f"ddpd/stack/{r}/{self.req}")
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
        dumps = self._signal_dumps([(pid, kind) for pid, kind, _ in wanted])
        for r in self.views:
            self.views[r].workers = []
        for pid, kind, r in wanted:
            frames = dumps.get(pid) or []
            if kind == "rank":
                if frames:
                    self.views[r].stack = frames
            else:
                self.views[r].workers.append({"pid": pid, "stack": frames})

    def _signal_dumps(self, targets: list[tuple[int, str]], wait_s: float = 2.0) -> dict[int, list[dict]]:
        """SIGUSR1 every target (faulthandler writes DIR/<kind>-<pid>.stack), then read what they wrote."""
        sizes: dict[int, tuple[str, int]] = {}
        for pid, kind in targets:
            path = os.path.join(self.run_dir, f"{kind}-{pid}.stack")
            try:
                before = os.path.getsize(path)
                os.kill(pid, signal.SIGUSR1)
                sizes[pid] = (path, before)
            except OSError:
                continue
        out: dict[int, list[dict]] = {}
        end = time.monotonic() + wait_s
        while sizes and time.monotonic() < end:
            time.sleep(0.05)
            for pid, (path, before) in list(sizes.items()):
                try:
                    if os.path.getsize(path) > before:
                        time.sleep(0.05)
                        with open(path, encoding="utf-8", errors="replace") as f:
                            f.seek(before)
                            out[pid] = parse_faulthandler(f.read())
                        del sizes[pid]
                except OSError:
                    del sizes[pid]
        return out

    def fatal_stack(self, pid: int) -> list[dict]:
        """The stack faulthandler wrote when the rank died of SIGABRT/SIGSEGV (gloo EnforceNotMet, ...)."""
        try:
            with open(os.path.join(self.run_dir, f"rank-{pid}.stack"), encoding="utf-8", errors="replace") as f:
                text = f.read()
        except OSError:
            return []
        i = text.rfind("Fatal Python error")
        return parse_faulthandler(text[i:]) if i >= 0 else []

    # -- deciding ------------------------------------------------------------------
    def hang_limit(self) -> tuple[float, str]:
        """(seconds, how it was chosen): explicit, or learned from the job's own step times."""
        if self.hang_timeout:
            return self.hang_timeout, "--hang-timeout"
        times: list[float] = []
        for v in self.views.values():
            times += (v.state or {}).get("step_times", [])[-50:]
        if len(times) >= 3:
            return max(FLOOR_S, K_STEP * _p(times, 0.9)), f"adaptive: {K_STEP:g} x p90 step time, floor {FLOOR_S:g}s"
        return FIRST_STEP_S, "adaptive: before the step time is known"

    def _live(self) -> list[RankView]:
        return [v for v in self.views.values() if v.state and not v.exit and not v.state.get("done")
                and not v.state.get("exc")]

    def decide(self) -> dict[str, Any] | None:
        now = time.monotonic()
        views = self.views
        # 1. desync (first: a mismatch is the root cause even when gloo then aborts both ranks)
        d = self.find_desync()
        if d:
            return d
        # 2. a rank raised / was killed / exited non-zero
        for r, v in views.items():
            st = v.state or {}
            if st.get("exc") or (v.exit and v.exit.get("exit_code") not in (0, None)) or (v.exit and v.exit.get("signal")):
                return {"reason": "exit", "rank": r}
        seen = [v for v in views.values() if v.state]
        if not seen:
            return None
        live = self._live()
        finished = [v for v in seen if (v.state.get("done") or (v.exit and v.exit.get("exit_code") == 0))]
        last_progress = max(v.progress_t for v in seen)
        stalled = now - last_progress
        if not all(v.started() for v in seen):
            # a rank still importing / before its first collective: the clock starts when all have started
            self.not_started_since = self.not_started_since or now
            last_progress = max(last_progress, now if now - self.not_started_since < BUSY_S else 0)
            stalled = now - last_progress
        else:
            self.not_started_since = None
        limit, how = self.hang_limit()
        self.last_limit = limit
        # 3. a rank finished while the others stall
        if finished and live and stalled > max(EXIT_GRACE_S, min(limit, 3 * EXIT_GRACE_S)):
            return {"reason": "exit", "rank": finished[0].rank, "finished": True, "stalled_s": stalled,
                    "limit_s": limit, "limit_how": how}
        # 4. hang
        if not live:
            return None
        if len(seen) < self.world_size and now - (self.first_state_t or now) < limit:
            return None
        busy = [v.rank for v in live if v.busy()]
        eff = limit if (self.hang_timeout or not busy) else max(limit, BUSY_S)
        if busy and not any((v.state or {}).get("step") for v in seen):
            # start-up (imports, DDP construction importing dynamo, first compile): even an explicit
            # --hang-timeout does not count while a rank visibly works before the first step
            eff = max(eff, BUSY_S)
        cur = {json.dumps([(v.state.get("in_collective") or {}).get(k) for k in ("group", "seq", "op")]) for v in live}
        if not self.hang_timeout and len(live) == self.world_size and len(cur) == 1 and live[0].state.get("in_collective"):
            # every rank is inside the very same collective: the program agrees; the transport is slow
            eff, how = max(eff, BUSY_S), "every rank inside the same collective: waiting for the transport"
        if busy and eff > limit and "transport" not in how:
            how = f"busy ranks {busy} (CPU or Python line moving): extended to {eff:g}s"
        if stalled > eff:
            return {"reason": "hang", "stalled_s": round(stalled, 2), "limit_s": round(eff, 2),
                    "limit_how": how, "busy": busy}
        return None

    def find_desync(self) -> dict[str, Any] | None:
        """First (group, seq) where two ranks' fingerprints disagree; or per-epoch step counts that differ."""
        views = [v for v in self.views.values() if v.state]
        if len(views) < 2:
            return None
        keys: dict[tuple, list[int]] = {}
        for v in views:
            for k in v.fps:
                keys.setdefault(k, []).append(v.rank)
        for k in sorted(keys, key=lambda k: (k[1], k[0])):
            ranks = keys[k]
            if len(ranks) < 2:
                continue
            fps = {r: self.views[r].fps[k] for r in ranks}
            kind = _compare(fps, self.views)
            if kind:
                return {"reason": "desync", "kind": kind, "group": k[0], "seq": k[1],
                        "calls": {r: _fp_dict(fp) for r, fp in fps.items()}}
        # per-epoch step counts of the train loader, for epochs every rank has finished
        counts = {v.rank: v.state.get("steps_by_epoch") or [] for v in views}
        if len(counts) == self.world_size:
            done_epochs = min(len(c) for c in counts.values()) - 1
            for e in range(max(0, done_epochs)):
                vals = {r: c[e] for r, c in counts.items()}
                if len(set(vals.values())) > 1:
                    return {"reason": "desync", "kind": "steps", "epoch": e, "steps": vals}
        return None

    # -- loop ----------------------------------------------------------------------
    def poll_once(self) -> dict[str, Any] | None:
        with self.lock:
            self.read_states()
            self.check_local_exits()
            if not self.is_host or self.failed_attempt is not None:
                return None  # (a failed attempt: nothing to decide until torch's agent restarts the ranks)
            return self.decide()

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
                decision["failed"] = any((v.state or {}).get("exc") or (v.exit or {}).get("signal")
                                         or (v.exit or {}).get("exit_code") not in (None, 0) for v in self.views.values())
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
                    decision["blocked"] = all(
                        ((self.views[int(r)].state or {}).get("in_collective") or {}).get("seq") == decision["seq"]
                        for r in decision["calls"])
                self.decision = decision
                if self.on_decision is not None:
                    self.on_decision(decision)
                return
            self.stopping.wait(POLL)

    def ack_all(self) -> None:
        for r, v in self.views.items():
            if (v.state or {}).get("exc") and r not in self.acked:
                try:
                    self.store.add(f"ddpd/ack/{self.attempt}/{r}", 1)
                    self.acked.add(r)
                except Exception:
                    pass

    def evidence(self) -> dict[str, Any]:
        """Everything diagnose() needs, as plain data (BOARD.md: PER-RANK EVIDENCE FORMAT)."""
        ranks: dict[int, dict[str, Any]] = {}
        for r, v in self.views.items():
            st = dict(v.state or {"rank": r, "missing": True})
            if not v.stack and (v.exit or {}).get("signal") in FATAL and st.get("pid"):
                v.stack = self.fatal_stack(st["pid"])
                st["fatal_stack"] = bool(v.stack)
            st["stack"] = v.stack
            st["threads"] = v.threads
            st["workers"] = v.workers
            st["exit"] = v.exit
            st["busy"] = v.busy() if v.state else False
            st["stalled_s"] = round(time.monotonic() - v.progress_t, 2)
            st["sites_seen"] = sorted([op, list(s) if s else None] for op, s in v.sites_seen)
            ranks[r] = st
        return {"world_size": self.world_size, "wall_s": round(time.monotonic() - self.started, 3),
                "ranks": ranks, "hang_limit_s": self.hang_limit()[0],
                "hang_limit_how": self.hang_limit()[1]}


_HOST = __import__("socket").gethostname()


def _fp_dict(fp) -> dict[str, Any]:
    op, shapes, dtypes, _sk, ep, st, site = fp
    return {"op": op, "shapes": list(shapes), "dtypes": list(dtypes), "site": site, "epoch": ep, "step_in_epoch": st}


def _compare(fps: dict[int, tuple], views: dict[int, RankView]) -> str | None:
    """None when the calls agree; else 'op'|'shape'|'site'|'steps' (what disagrees)."""
    vals = list(fps.values())
    ops = {f[0] for f in vals}
    if len(ops) > 1:
        return "op"
    if len({(f[1], f[2]) for f in vals}) > 1:
        return "shape"
    sites = {f[3] for f in vals}
    op = vals[0][0]
    if len(sites) > 1:
        if op.startswith("ddp."):
            # a DDP call at a line some other rank never ran it at: DDP on a subset of ranks
            for r, f in fps.items():
                if any((op, f[3]) not in views[o].sites_seen for o in fps if o != r):
                    return "site"
        return None  # same collective from two branches (e.g. src/dst branches): fine
    eps = {(f[4], f[5]) for f in vals if f[4] is not None}
    if len(eps) > 1 and all(f[4] is not None for f in vals):
        return "steps"
    return None


_FH_THREAD = re.compile(r"^(Current thread|Thread) (0x[0-9a-f]+)")
_FH_FRAME = re.compile(r'^\s+File "(.*)", line (\d+) in (.*)$')


def parse_faulthandler(text: str) -> list[dict]:
    """The main thread's stack from a faulthandler dump (outermost first); the last dump in ``text``."""
    threads: list[list[dict]] = []
    cur: list[dict] | None = None
    for line in text.splitlines():
        if _FH_THREAD.match(line):
            cur = []
            threads.append(cur)
        else:
            m = _FH_FRAME.match(line)
            if m and cur is not None:
                cur.append({"path": m.group(1), "line": int(m.group(2)), "function": m.group(3).strip()})
    if not threads:
        return []
    # the main thread is the one whose outermost frame is the program's entry (runpy / <module>)
    stacks = [list(reversed(t)) for t in threads]
    for st in stacks:
        if st and (st[0]["function"] in ("<module>", "_run_module_as_main")):
            return st
    return stacks[0]


def _peek_exit(pid: int) -> dict[str, Any] | None:
    """Exit code / signal of a dead child without reaping it; None while it runs."""
    try:
        res = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return None
    except OSError:
        return None
    if res is None:
        return None
    if res.si_code == os.CLD_EXITED:
        return {"exit_code": res.si_status, "signal": None}
    try:
        name = signal.Signals(res.si_status).name
    except ValueError:
        name = str(res.si_status)
    return {"exit_code": -res.si_status, "signal": name}
