"""One node's ranks, reduced: the watcher's per-rank views -> a :class:`~ddp_doctor.evidence.NodeSummary`.

Both paths of the live verdict go through it: a single node decides from the summary of its own views,
and on several nodes every node's agent posts its summary and the root decides from all of them
(``diagnose.jobview`` merges, ``diagnose.live`` decides).  Everything the policy asks of a rank is in the
summary, reduced per node: who waits in which collective (grouped by position and line) and for how long,
who is outside collectives at which line and since when it showed a sign of life, the newest progress and
sign of life, failed and finished ranks, the collective nearest its process group's timeout, and a desync
proven among the node's own ranks (``find_desync``, the same function the single node always used).

Who waits where and who is outside collectives matter to the policy only once something has waited a while
(a finished rank may be needed) or nothing has progressed (a warning, a stop): a summary carries the
collectives waited in for at least ``QUIET_S``, and every rank's position once the node's ranks have made no
progress for ``QUIET_S``; durations in steps (:func:`seconds`).  A busy, healthy node's summary is small.

For the root to compare collectives *across* nodes without fingerprints, a summary also carries a 64-bit
code per position its ranks reached since its previous summary (:func:`fp_code`): the op, shapes and
dtypes, the line, and the training position each hashed apart, so the root can tell which of them differ.
"""
from __future__ import annotations

from typing import Any

from ddp_doctor.diagnose.jobview import fp_code, pg_slack
from ddp_doctor.diagnose.live import find_desync
from ddp_doctor.evidence import Collective, Deadline, Digests, Finished, NodeSummary, Outside, Waiting

OVERLAP = 4           # positions re-sent from the previous summary (a summary the root missed loses nothing)
WINDOW = 64           # the most positions of a group one summary carries
QUIET_S = 1.0         # who waits where / who is outside: sent once a wait or the node's quiet is this long
NEAR_S = 60.0         # the collective nearest its process group's timeout: sent once within this of it


def seconds(x: float) -> float:
    """A duration as summaries carry it: 0.1 s steps below 2 s, whole seconds above (so a summary of
    ranks that wait does not change every interval)."""
    return round(x, 1) if x < 2.0 else float(int(x))


def _p90(values: list[float]) -> float:
    v = sorted(values)
    return v[min(len(v) - 1, int(0.9 * (len(v) - 1) + 0.5))] if v else 0.0


def calm(node: NodeSummary, world_size: int) -> bool:
    """Every rank posted and progressed within ``QUIET_S``, and none waits, is outside collectives, failed,
    finished, nears its process group's timeout or disagrees: nothing the policy acts on can be under way,
    so a single node's watcher may look less often (a rank that stops is seen within one such look)."""
    return (len(node.ranks) >= world_size and len(node.live) == len(node.ranks) and not node.waiting
            and not node.outside and node.deadline is None and node.desync is None
            and node.progress_age_s is not None and node.progress_age_s < QUIET_S)


class _Cut:
    """A view as ``find_desync`` reads it, with some of its fingerprints (``Summarizer._window``)."""

    __slots__ = ("rank", "state", "exit", "fps")

    def __init__(self, rank: int, state: Any, exit: Any, fps: dict) -> None:
        self.rank, self.state, self.exit, self.fps = rank, state, exit, fps


class Summarizer:
    """Makes a node's summaries; keeps the version counter and which positions were already sent."""

    def __init__(self, node: int = 0, digests: bool = False) -> None:
        self.node = node
        self.version = 0
        self.digests = digests       # only several nodes need them
        self.sent: dict[str, int] = {}
        self.compared: dict[int, set] = {}  # per rank, positions whose fingerprints agreed (``find_desync``)
        self.counted: dict[int, tuple[Any, int]] = {}  # rank -> (its view, positions it had gained) last time
        self.proven = False                 # the previous summary carried a desync
        self.codes: dict[int, tuple[Collective, int]] = {}   # id -> (fingerprint, its code) (``_code``)

    def summary(self, views: dict[int, Any], now: float, *, first_state_t: float | None = None,
                host: str | None = None) -> NodeSummary:
        self.version += 1
        seen = [v for v in views.values() if v.state is not None]
        live = [v for v in seen if not v.exit and not v.state.done and not v.state.exc]
        waiting: dict[tuple, tuple[Collective, list[int]]] = {}
        outside: list[Outside] = []
        deadline: tuple[float, Deadline] | None = None
        progress_age = max(0.0, now - max(v.progress_t for v in live)) if live else None
        quiet = progress_age is None or progress_age >= QUIET_S
        for v in live:
            c = v.state.in_collective
            if c is None:
                if quiet:
                    outside.append(Outside(v.rank, v.state.where, seconds(v.idle_s(now))))
                continue
            t = v.state.pg_timeout_s
            if t and c.waiting_s is not None:
                slack = pg_slack(c.waiting_s, t)
                if slack >= -NEAR_S and (deadline is None or slack > deadline[0]):
                    deadline = (slack, Deadline(v.rank, c, t))
            waited = seconds(c.waiting_s or 0.0)
            if not quiet and waited < QUIET_S:
                continue
            k = (c.group, c.seq, c.op, c.site.key() if c.site else None)
            have = waiting.get(k)
            if have is None or waited > (have[0].waiting_s or 0):
                waiting[k] = (Collective(c.group, c.seq, c.op, c.shapes, c.dtypes, c.site, c.origin, waited,
                                         join=c.join, blocking=c.blocking or bool(have and have[0].blocking)),
                              (have[1] if have else []))
            waiting[k][1].append(v.rank)
        finished: dict[tuple, list[int]] = {}
        for v in seen:
            if v.state.done or (v.exit and v.exit.exit_code == 0):
                finished.setdefault(tuple(sorted(v.state.seq.items())), []).append(v.rank)
        times: list[float] = []
        for v in seen:
            times += list(v.state.step_times[-50:])
        states = [v.state for v in seen]
        return NodeSummary(
            node=self.node, version=self.version, t=round(now, 3), host=host or next((s.host for s in states if s.host), None),
            attempt=max((s.attempt for s in states), default=0),
            world_size=next((s.world_size for s in states if isinstance(s.world_size, int)), None),
            ranks=tuple(sorted(v.rank for v in seen)), live=tuple(sorted(v.rank for v in live)),
            failed=tuple(sorted(v.rank for v in seen if v.state.exc or (v.exit and v.exit.failed))),
            finished=tuple(Finished(dict(k), tuple(sorted(rs))) for k, rs in finished.items()),
            waiting=tuple(Waiting(c, tuple(sorted(rs))) for c, rs in waiting.values()),
            outside=tuple(outside), busy=tuple(sorted(v.rank for v in live if v.busy(now))),
            progress_age_s=progress_age,
            active_age_s=max(0.0, now - max(v.active_t for v in live)) if live else None,
            first_t=None if first_state_t is None else round(min(now, first_state_t), 3),
            progress=sum(v.state.progress for v in live), deadline=None if deadline is None else deadline[1],
            step_p90_s=_p90(times) if times else None, step_n=len(times),
            desync=self._desync(views),
            digests=self._digests(seen) if self.digests else ())

    def _desync(self, views: dict[int, Any]) -> Any:
        """``find_desync`` over the positions some rank reached since the previous summary, each view cut to
        those (a poll compared the thousands of positions each view keeps -- most of a node agent's CPU --
        only to find them compared already).  Every position is compared as before where a view cannot say
        what it gained, and once a desync is proven: the proof is found again and explained from all."""
        window = None if self.proven else self._window(views)
        d = find_desync(views if window is None else window, len(views), self.compared)
        if d is not None and window is not None:
            d = find_desync(views, len(views), self.compared)
        self.proven = d is not None
        self.counted = {r: (v, getattr(v, "fps_count", 0)) for r, v in views.items()}
        return d

    def _window(self, views: dict[int, Any]) -> dict[int, Any] | None:
        """Each view with only its fingerprints at positions in [lowest, highest] of those some rank gained
        since the previous summary, per group (a rank that reaches a position late is compared with the
        others' calls there); None when a view cannot say what it gained."""
        lo: dict[Any, int] = {}
        hi: dict[Any, int] = {}
        for r, v in views.items():
            count, added = getattr(v, "fps_count", None), getattr(v, "fps_added", None)
            if count is None or added is None:
                return None
            prev = self.counted.get(r)
            n = count - prev[1] if prev is not None and prev[0] is v else count
            if n < 0 or n > len(added):
                return None
            for i in range(len(added) - n, len(added)):
                g, seq = added[i]
                if not isinstance(seq, int):
                    return None
                if seq < lo.get(g, seq + 1):
                    lo[g] = seq
                if seq > hi.get(g, -1):
                    hi[g] = seq
        out = {}
        for r, v in views.items():
            fps = v.fps
            cut = {}
            for g, a in lo.items():
                b = hi[g]
                if b - a < len(fps):
                    for seq in range(a, b + 1):
                        c = fps.get((g, seq))
                        if c is not None:
                            cut[(g, seq)] = c
                else:  # (a span wider than the view: a numbering that jumped -- DDP's Join starts a new era)
                    cut.update(((g2, seq), c) for (g2, seq), c in fps.items() if g2 == g and a <= seq <= b)
            out[r] = _Cut(v.rank, v.state, v.exit, cut)
        return out

    def _code(self, c: Collective) -> int:
        """``fp_code`` of a fingerprint, once per fingerprint object (the OVERLAP positions come again)."""
        got = self.codes.get(id(c))
        if got is None or got[0] is not c:
            if len(self.codes) > 4096:
                self.codes.clear()
            got = self.codes[id(c)] = (c, fp_code(c))
        return got[1]

    def _digests(self, seen: list[Any]) -> tuple[Digests, ...]:
        """The codes of each group's positions reached since the previous summary (and OVERLAP before)."""
        out = []
        groups = {g for v in seen for g in v.state.seq}
        for g in sorted(groups, key=str):
            hi = max(v.state.seq.get(g, 0) for v in seen) - 1
            if hi < 0:
                continue
            lo = max(self.sent.get(g, -1) + 1 - OVERLAP, hi - WINDOW + 1, 0)
            if lo > hi:
                continue
            codes = []
            for s in range(lo, hi + 1):
                got = set()
                for v in seen:
                    c = v.fps.get((g, s))
                    if c is not None:
                        code = self._code(c)
                        if code:
                            got.add(code)
                codes.append(tuple(sorted(got)))
            self.sent[g] = hi
            out.append(Digests(g, lo, tuple(codes)))
        return tuple(out)
