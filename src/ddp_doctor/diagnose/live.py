"""The live verdict: while the job runs, decide from the watcher's view of every rank whether it is lost.

The watcher collects (``watch/``); this module decides, so that every verdict of ddp-doctor is made in
``diagnose/``.  ``views`` maps rank -> the watcher's per-rank view: ``.rank``, ``.state`` (the rank's
latest published state), ``.exit``, ``.progress_t`` (last program progress: a step, a batch, a
completed collective), ``.active_t`` (last sign of life: progress, or its training thread's CPU, I/O
or stack moving), ``.fps`` ({(group, seq): fingerprint}), ``.sites_seen`` ({(op, site key)}),
``.started()`` and ``.busy()``.

The policy (docs/verdicts.md): a job is stopped only on *proof* -- ranks paired different collectives
(``desync``), a rank failed, or a rank that finished is needed by a collective another rank waits in
(``exit``) -- or when a collective has waited almost the process group's own timeout (``hang``
``pg-timeout``: it would fail the job anyway).  When *no* rank has shown a sign of life for the limit
(``--hang-timeout``, default ``NO_PROGRESS_S``) the job is ``stalled``: a diagnosis, written and printed
once, and the job keeps running -- a rank blocked on a peer outside the job (a storage service, a child
process, a file on a slow mount) may be answered, and nothing proves it will not.  When a rank shows a
sign of life again the stall has ``resumed``.  Only ``--stop-on-stall`` makes the limit a stop (``hang``),
as the user's choice.  Anything less is a :class:`Suspicion`: a live warning, never a stop.

``stalled`` and ``resumed`` are events (:data:`EVENTS`), not stops: the watcher diagnoses and goes on.

The policy reads the job through a :class:`~ddp_doctor.diagnose.jobview.JobView`: node summaries
(``diagnose.summary``) merged, so the same rules decide a single node (one summary of its own views) and a
job of thousands of ranks (one summary per node, read by the root).
"""
from __future__ import annotations

import time
from typing import Any

from ddp_doctor.diagnose import jobview
from ddp_doctor.diagnose.jobview import JobView
from ddp_doctor.evidence import GROUP_CREATION, Collective, JobEvidence, Suspicion, Verdict

NO_PROGRESS_S = 90.0     # default limit: no rank showed any sign of life for this long -> hang
TRANSPORT_S = 300.0      # every rank waits inside the very same collective: the transport is slow
WARN_FLOOR_S = 5.0       # a live warning once no rank progressed for max(this, K_STEP x p90 step time)
WARN_FIRST_S = 10.0      # ... before the job's step time is known
K_STEP = 10.0
FINISH_GRACE_S = 1.0     # a finished rank is needed: the waiting rank has waited at least this long
PG_MARGIN_S = jobview.PG_MARGIN_S  # stop this long before the process group's timeout would fail the job
CYCLE_S = 1.0            # two ranks blocked this long, each in a collective the other never entered: proof
RESUME_S = 0.5           # a sign of life this long after a stall began: the job moved again
EVENTS = ("stalled", "resumed")  # decisions that never stop the job: a stall's diagnosis, and its end


def stops(decision: Verdict) -> bool:
    """Does this decision stop the job (a proof, the process group's timeout ahead, --stop-on-stall)?"""
    return decision.reason not in EVENTS


def group_ranks(group: str | None, world_size: int) -> set[int] | None:
    """The global ranks of a probe group key ("world", "pg:0,1"; group creation is the world's); None when
    unknown."""
    if group in ("world", GROUP_CREATION):
        return set(range(world_size))
    if group and group.startswith("pg:"):
        try:
            return {int(x) for x in group[3:].partition("~")[0].split(",") if x}
        except ValueError:
            return None
    return None


class Judge:
    """Decides for one watched attempt; keeps the little state a decision needs between polls.

    It decides from a :class:`~ddp_doctor.diagnose.jobview.JobView`: the summaries of the job's nodes merged
    (``decide_job``; one summary of the watcher's own views on a single node: ``decide``)."""

    def __init__(self, hang_timeout: float | None, stop_on_stall: bool = False) -> None:
        self.hang_timeout = hang_timeout
        self.stop_on_stall = stop_on_stall        # the user's choice: the limit stops the job (``hang``)
        self.stall_since: float | None = None     # the job is stalled: since when no rank showed a sign of life
        self.suspicion: Suspicion | None = None   # the live warning now (None: nothing to warn about)
        self.longest: Suspicion | None = None     # the longest warning of the run (reported as info)
        self._waits: tuple = ()                   # the nodes' waits the warning's maps were made of

    def warn_after(self, job: JobView) -> float:
        """No progress for this long earns a live warning (learned from the job's own step times)."""
        if job.step_n >= 3 and job.step_p90 is not None:
            return max(WARN_FLOOR_S, K_STEP * job.step_p90)
        return WARN_FIRST_S

    def hang_limit(self, views: dict[int, Any] | None = None) -> tuple[float, str]:
        """(seconds, how it was chosen): how long no rank may show any sign of life before a stop."""
        if self.hang_timeout:
            return self.hang_timeout, "--hang-timeout"
        return NO_PROGRESS_S, f"default: {NO_PROGRESS_S:g}s without any sign of life on any rank"

    def decide_job(self, job: JobView, now: float | None = None) -> Verdict | None:
        """The live verdict: proof (a desync, a failed rank, a finished rank someone waits for), the process
        group's timeout ahead, or an event: a job in which no rank has shown a sign of life for the limit is
        ``stalled`` (once; ``hang`` with ``--stop-on-stall``), and ``resumed`` once one does again.  Sets
        ``suspicion`` on the way."""
        # 1. desync (first: a mismatch is the root cause even when gloo then aborts both ranks)
        if job.desync is not None:
            return job.desync
        # 2. a rank raised / was killed / exited non-zero
        if job.failed:
            return Verdict("exit", rank=job.failed[0])
        if not job.seen:
            return None
        now = time.monotonic() if now is None else now
        if self.stall_since is not None:  # stalled: has a rank shown a sign of life since it began?
            quiet = min(job.progress_age or 0.0, job.active_age or 0.0) if job.live else 0.0
            if now - quiet > self.stall_since + RESUME_S:
                lasted, self.stall_since = now - quiet - self.stall_since, None
                return Verdict("resumed", stalled_s=round(lasted, 1))
        # 3. a rank that finished is needed by a collective another rank waits in
        needed = self._finished_needed(job) if job.finished_any else None
        if needed:
            return needed
        if not job.live:
            self.suspicion = None
            return None
        limit, how = self.hang_limit()
        if job.seen < job.world_size and (job.first_age or 0.0) < limit:
            return None  # a rank has not reported yet (still importing)
        stalled, idle = job.progress_age or 0.0, job.active_age or 0.0
        self._warn(job, stalled, limit)
        # 4. the process group's own timeout is about to fail the job: stop now, with every stack
        d = job.deadline
        if d is not None and jobview.pg_slack(d.coll.waiting_s or 0.0, d.timeout_s) >= 0:
            c, t = d.coll, d.timeout_s
            return Verdict("hang", kind="pg-timeout", stalled_s=round(stalled, 2), limit_s=round(t, 2),
                           limit_how=f"rank {d.rank} has waited {c.waiting_s:.0f}s in {c.op}; the process group's "
                                     f"timeout ({t:g}s) would fail the job", busy=job.busy())
        # 5. no rank has shown any sign of life for the limit
        if min(stalled, idle) <= limit:
            return None
        if not self.hang_timeout and job.live == job.world_size and not job.outside_n \
                and len({k[:3] for k in job.waiting()}) == 1:
            # every rank is inside the very same collective: the program agrees; the transport is slow
            limit, how = max(limit, TRANSPORT_S), "every rank inside the same collective: waiting for the transport"
        if job.late:
            return None  # a node not heard from lately may be alive: never stop on a guess
        if min(stalled, idle) <= limit:
            return None
        if self.stop_on_stall:  # the user's choice: a stall is a stop
            return Verdict("hang", stalled_s=round(stalled, 2), limit_s=round(limit, 2),
                           limit_how=f"{how}, --stop-on-stall", busy=job.busy())
        if self.stall_since is not None:
            return None  # diagnosed once; the job keeps running
        self.stall_since = now - min(stalled, idle)
        return Verdict("stalled", stalled_s=round(stalled, 2), limit_s=round(limit, 2), limit_how=how,
                       busy=job.busy())

    def _finished_needed(self, job: JobView) -> Verdict | None:
        """A rank ended normally and another waits in a collective of a group it belongs to, at a position
        it never issued: it can never be joined (proof).  Ending after one's last collective is fine."""
        finished = job.finished()
        for c, _ranks in sorted(job.waiting().values(), key=lambda cr: min(cr[1])):
            if c.seq is None or (c.waiting_s or 0) < FINISH_GRACE_S:
                continue
            members = group_ranks(c.group, job.world_size)
            if members is None:
                continue
            for r, seq in finished:
                if r in members and seq.get(c.group, 0) <= c.seq:
                    return Verdict("exit", rank=r, finished=True, stalled_s=round(c.waiting_s or 0, 2))
        return None

    def _warn(self, job: JobView, stalled: float, limit: float) -> None:
        """Keep the live warning current: no rank progressed for the warning threshold and some rank waits
        in a collective (for the others), or no live rank shows any sign of life.  A long phase that keeps
        every rank busy (an export, an evaluation on every rank) is not suspicious."""
        after = self.warn_after(job)
        if stalled < after:
            self.suspicion = None
            return
        waits = job.waits()
        prev = self.suspicion
        if prev is not None and len(waits) == len(self._waits) and all(a is b for a, b in zip(waits, self._waits)):
            # the same waits as at the last poll (a large job's nodes resend them unchanged): only the clock moved
            if not prev.waiting and (job.active_age or 0.0) < after:
                self.suspicion = None
                return
            s = Suspicion(round(stalled, 1), prev.waiting, prev.outside, prev.idle_s, limit)
        else:
            waiting = {r: c for c, ranks in job.waiting().values() for r in ranks}
            if not waiting and (job.active_age or 0.0) < after:
                self.suspicion = None
                return
            outside = job.outside()
            s = Suspicion(round(stalled, 1), dict(sorted(waiting.items())), {o.rank: o.where for o in outside},
                          {o.rank: round(o.idle_s, 1) for o in outside}, limit)
            self._waits = waits
        self.suspicion = s
        if s.waiting and s.outside and (self.longest is None or s.stalled_s >= self.longest.stalled_s):
            self.longest = s  # the longest a rank outside collectives kept others waiting (info in the report)


def stall_proof(ev: JobEvidence, d: Verdict) -> Verdict | None:
    """At a stall, with every stack taken: a fact that a rank can never resume, so the stall is a hang (a stop).

    A rank waits for a batch from its DataLoader and every worker of that loader is ``frozen`` (one thread
    blocked on a lock of its own process with no timeout: no thread can ever release it, the lock was
    inherited locked across fork).  Nothing else is proof here: a rank blocked on a peer outside the job may
    be answered."""
    for r, st in sorted(ev.ranks.items()):
        w = st.in_data_wait
        if w is None or st.done or st.exc or st.exit or w.loader is None or not 0 <= w.loader < len(st.loaders):
            continue
        pids = set(st.loaders[w.loader].worker_pids)
        frozen = {x.pid for x in st.workers if x.frozen}
        if pids and pids <= frozen:
            return d.with_(reason="hang", kind="frozen-workers", rank=r,
                           limit_how=f"every DataLoader worker of rank {r} ({', '.join(map(str, sorted(pids)))}) "
                                     "waits on a lock no thread of its process can release")
    return None


def find_desync(views: dict[int, Any], world_size: int, compared: dict[int, set] | None = None
                ) -> Verdict | None:
    """The first proof of a desync: a (group, seq) where ranks paired calls that torch requires to agree and
    they do not (``Collective.must_agree``), or two ranks blocked in each other's groups (``cycle``).

    Only facts a correct program cannot produce: never the line a call came from, nor the training epoch
    or step the probe inferred from loader passes and optimizer steps (those only explain a proof: the
    verdict's ``parted`` is the first position where the ranks' calls came from different training
    epochs or DDP lines, where they parted before the mismatch showed).

    ``compared`` (kept by a caller that asks every poll): per rank, the positions of its fingerprints
    already compared with every rank that had reached them then, and found to agree.  A fingerprint
    never changes once posted, so a poll compares only the positions some rank reached since the last
    one, not the thousands a view keeps."""
    seen = [v for v in views.values() if v.state]
    if len(seen) < 2:
        return None
    done = {} if compared is None else compared
    fresh: set = set()
    for v in seen:
        fresh |= v.fps.keys() - done.get(v.rank, ())
    for k in sorted(fresh, key=lambda k: (k[1], k[0])):
        ranks = [v.rank for v in seen if k in v.fps]
        fps = {r: views[r].fps[k] for r in ranks}
        # inside DDP's Join the joined ranks shadow the others' calls: no pairing to check
        kind = None if len(ranks) < 2 or any(c.join for c in fps.values()) else _compare(fps)
        if kind:
            return Verdict("desync", kind=kind, group=k[0], seq=k[1], calls=fps,
                           parted=parted_calls({v.rank: v.fps for v in seen}, k[0], k[1]))
        for r in ranks:  # (a rank that reaches k later makes it fresh again, for every rank that holds it)
            done.setdefault(r, set()).add(k)
    for v in seen:  # positions the views no longer keep
        have = done.get(v.rank)
        if have is not None and len(have) > 2 * len(v.fps):
            have &= v.fps.keys()
    return _waiting_for_each_other(seen, world_size)


def parted_calls(fps: dict[int, Any], group: str | None = None, before: int | None = None
                 ) -> dict[int, Collective]:
    """Where the ranks parted before a mismatch showed: each rank's call at the first position (of ``group``,
    before ``before``; any when None) whose calls agree as torch sees them but come from different training
    epochs or, for the DDP model, different lines.  ``fps``: rank -> {(group, seq):
    fingerprint}.  Inferred: it explains a proof, it never makes one."""
    keys = sorted({k for m in fps.values() for k in m
                   if (group is None or k[0] == group) and (before is None or k[1] < before)},
                  key=lambda k: (k[1], str(k[0])))
    for k in keys:
        calls = {r: m[k] for r, m in fps.items() if k in m}
        if len(calls) < 2 or any(c.join for c in calls.values()):
            continue
        vals = list(calls.values())
        if len({c.must_agree() for c in vals}) > 1:
            return {}  # the ranks disagree here already: that is the proof, not a parting before it
        if len({c.epoch for c in vals}) > 1 and all(c.epoch is not None for c in vals):
            return calls  # a rank already in the next training epoch: it ran fewer steps in this one
        # (a line unknown on a rank -- a DDP model adopted by a late watch() -- is no different line)
        if vals[0].op.startswith("ddp.") and all(c.site for c in vals) and len({c.site.key() for c in vals}) > 1:
            return calls
    return {}


def _waiting_for_each_other(seen: list[Any], world_size: int) -> Verdict | None:
    """Ranks blocked in collectives of different groups, each waiting for the next around a cycle: rank a
    waits at (G, s) for b, a member of G that has not entered that call, being blocked at (H, t) of another
    group, where it waits for c ... and so back to a.  No call on the cycle can return (gloo's collectives
    wait for every member), so none ever will: proof of a deadlock, which no single group's sequence shows
    (a rank-conditional collective inside a node group while its peer is in the world group's gradient
    all-reduce; on a 2-D mesh, a "tp" pair's all-reduce while the partner is in the "dp" group's all-gather,
    four ranks round).  Only calls the rank's thread is inside (not asynchronous ones, which it may
    overtake), of known groups (group creation waits for its members only), waited in for at least
    ``CYCLE_S``, by states that show one moment: the waits on the cycle all overlapped."""
    blocked = {}
    for v in seen:
        st, c = v.state, v.state.in_collective
        if v.exit or st.done or st.exc or c is None or not c.blocking or c.join or c.seq is None:
            continue
        if c.group == GROUP_CREATION or (c.waiting_s or 0) < CYCLE_S or st.t is None:
            continue
        blocked[v.rank] = (st, c)

    def waits_for(a: int) -> list[int]:
        sa, ca = blocked[a]
        members = group_ranks(ca.group, world_size) or set()
        return [b for b, (sb, cb) in sorted(blocked.items())
                if b != a and b in members and cb.group != ca.group and sb.seq.get(ca.group, 0) <= ca.seq]

    def overlapped(cycle: list[int]) -> bool:
        return max(blocked[r][0].t - blocked[r][1].waiting_s for r in cycle) <= min(blocked[r][0].t for r in cycle)

    for start in sorted(blocked):
        path, todo, visited = [start], [iter(waits_for(start))], {start}
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                path.pop()
                todo.pop()
            elif nxt == start and len(path) > 1 and overlapped(path):
                ca = blocked[start][1]
                return Verdict("desync", kind="cycle", group=ca.group, seq=ca.seq,
                               calls={r: blocked[r][1] for r in path})
            elif nxt not in visited and nxt > start:  # each cycle from its lowest rank; each rank once
                visited.add(nxt)
                path.append(nxt)
                todo.append(iter(waits_for(nxt)))
    return None


def any_failed(views: dict[int, Any]) -> bool:
    """Has a rank raised, been killed or exited non-zero?  Fixed at the moment of a decision: failures
    after it are consequences of the stop, not the verdict."""
    return any((v.state is not None and v.state.exc is not None) or (v.exit is not None and v.exit.failed)
               for v in views.values())


def blocked_at(decision: Verdict, views: dict[int, Any]) -> bool:
    """Every rank of a fingerprint desync still waits at its call of the mismatch (group and sequence number:
    the job hangs there); False when they moved on (gloo paired the mismatched calls silently)."""
    def still_in(r: int, c: Collective) -> bool:
        cur = views[r].state.in_collective if views[r].state is not None else None
        return cur is not None and (cur.group, cur.seq) == (c.group, c.seq)

    return all(still_in(r, c) for r, c in decision.calls.items())


def _compare(fps: dict[int, Collective]) -> str | None:
    """None when the calls agree as torch requires; else 'op' | 'shape' (op and shapes/dtypes are one
    ``must_agree`` tuple: 'op' when the ops differ)."""
    vals = list(fps.values())
    if len({c.must_agree()[0] for c in vals}) > 1:
        return "op"
    if len({c.must_agree() for c in vals}) > 1:
        return "shape"
    return None
