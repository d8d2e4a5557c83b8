"""The job as the live verdict sees it: node summaries merged (one summary on a single node).

:class:`JobView` answers the questions of ``diagnose.live.Judge`` over every node at once.  What every
poll needs (newest progress and sign of life, failures, proofs, how many ranks are seen and live) is
merged eagerly in one pass over the nodes; who waits where and who is outside collectives only when the
policy asks (a warning is due, or a rank finished): the root's cost per interval stays a few
microseconds per node.

A level of the tree of watchers (``watcher.tree``) is the same merge applied again: a group leader makes a
JobView of its group's node summaries and posts :meth:`JobView.summary` of it up as one summary; the root
merges the leaders' summaries as it would nodes'.  A node a leader lost or finds late travels up inside it.

Ages: a summary's ages are as of when its node made it; the root adds the time since it first read that
version of the summary (``age``), so a node it has not heard from ages honestly.  A node that is *late*
(no new summary for a while) must not look stalled: the policy does not stop on "no sign of life" while
one is late; once it is *lost* its ranks' last known times stand.

:class:`CrossCheck` compares the fingerprint codes nodes send per position (``summary.fp_code``): codes
that could be a desync make the two nodes *suspects*; the root then pulls their ranks' fingerprints and
proves (or clears) it with ``live.find_desync``, the one comparison of collectives.
"""
from __future__ import annotations

import zlib
from typing import Any

from ddp_doctor.evidence import (Collective, Deadline, Digests, Finished, NodeLoss, NodeSummary, Outside, Verdict,
                                 Waiting)

PG_MARGIN_S = 5.0     # a collective is due this long before its process group's timeout (5% of short ones)


def pg_slack(waiting_s: float, timeout_s: float) -> float:
    """Seconds past the point where the process group's own timeout is about to fail the job (>= 0: due)."""
    return waiting_s - (timeout_s - min(PG_MARGIN_S, 0.05 * timeout_s))


def fp_code(c: Collective) -> int:
    """A collective's fingerprint as one 64-bit code of what torch requires the ranks' calls to agree on
    (``Collective.must_agree``); 0: not compared (inside DDP's Join)."""
    if c.join:
        return 0
    raw = repr(c.must_agree()).encode()
    return ((zlib.crc32(raw) << 32) | zlib.crc32(raw[::-1])) or 1


def codes_differ(a: int, b: int) -> bool:
    """Could two ranks' calls at one position be a desync?  Different codes of calls both compared: the
    root pulls both nodes' fingerprints and ``live.find_desync`` proves (or clears) it."""
    return bool(a and b and a != b)


LATE_S = 3.0          # no new summary from a node for this long: late (no "no sign of life" verdict meanwhile)
LOST_S = 15.0         # ... for this long: lost (its ranks unwatched; their last known times stand)


class JobView:
    """Merged node summaries (see the module doc).  ``nodes``: [(summary, seconds since it was read)]."""

    def __init__(self, world_size: int, nodes: list[tuple[NodeSummary, float]], *, late: tuple[int, ...] = (),
                 lost: tuple[NodeLoss, ...] = (), desync: Verdict | None = None) -> None:
        self.world_size = world_size
        self.nodes = nodes
        # a summary of a group whose leader finds nodes late or lost: late / lost here too
        self.late = late + tuple(s.node for s, _ in nodes if s.late)
        self.lost = lost + tuple(x for s, _ in nodes for x in s.lost)
        self.desync = desync
        seen = live = 0
        failed: list[int] = []
        self.progress_age: float | None = None
        self.active_age: float | None = None
        self.first_age: float | None = None
        self.finished_any = False
        self.outside_n = 0
        deadline = None
        p90, n = None, 0
        for s, age in nodes:
            seen += len(s.ranks)
            live += len(s.live)
            if s.failed:
                failed += s.failed
            if self.desync is None and s.desync is not None:
                self.desync = s.desync
            if s.finished:
                self.finished_any = True
            self.outside_n += len(s.outside)
            if s.progress_age_s is not None:
                a = s.progress_age_s + age
                self.progress_age = a if self.progress_age is None else min(self.progress_age, a)
            if s.active_age_s is not None:
                a = s.active_age_s + age
                self.active_age = a if self.active_age is None else min(self.active_age, a)
            if s.first_t is not None:
                a = s.t - s.first_t + age
                self.first_age = a if self.first_age is None else max(self.first_age, a)
            if s.deadline is not None and (deadline is None or _later(s.deadline, deadline)):
                deadline = s.deadline
            if s.step_n:
                n += s.step_n
                p90 = s.step_p90_s if p90 is None else max(p90, s.step_p90_s or 0.0)
        self.seen = seen
        self.live = live
        self.failed = tuple(sorted(failed))
        self.deadline = deadline
        self.step_p90 = p90
        self.step_n = n

    def waiting(self) -> dict[tuple, tuple[Collective, list[int]]]:
        """(group, seq, op, line) -> (the collective, with the longest wait; its ranks), over every node."""
        out: dict[tuple, tuple[Collective, list[int]]] = {}
        for s, _ in self.nodes:
            for w in s.waiting:
                c = w.coll
                k = (c.group, c.seq, c.op, c.site.key() if c.site else None)
                have = out.get(k)
                if have is None:
                    out[k] = (c, list(w.ranks))
                else:
                    have[1].extend(w.ranks)
                    if (c.waiting_s or 0) > (have[0].waiting_s or 0):
                        out[k] = (c, have[1])
        return out

    def waits(self) -> tuple:
        """Every node's waiting and outside records, to tell whether they changed (``is``) since a poll."""
        return tuple(x for s, _ in self.nodes for x in (s.waiting, s.outside))

    def outside(self) -> list[Outside]:
        """Every rank outside collectives, by rank; its idle time as of now."""
        return sorted((Outside(o.rank, o.where, o.idle_s + age) if age else o
                       for s, age in self.nodes for o in s.outside), key=lambda o: o.rank)

    def finished(self) -> list[tuple[int, dict]]:
        """(rank, its collectives per group) of every rank that ended normally, by rank."""
        return sorted(((r, f.seq) for s, _ in self.nodes for f in s.finished for r in f.ranks), key=lambda x: x[0])

    def cycle_pairs(self, members, world: str | None = None, wait_s: float = 1.0) -> list[tuple[tuple, frozenset]]:
        """Nodes whose ranks may wait for each other in collectives of different groups (``live``'s cycle,
        asked of the summaries: a rank of node X blocked >= ``wait_s`` at (G, s), a rank of node Y at (H, t),
        each a member of the other's group).  ``members(group, world_size)``: a group's ranks.  Only a
        suspicion: ``find_desync`` over the two nodes' pulled states proves it."""
        blocked = [(s.node, w) for s, _ in self.nodes for w in s.waiting
                   if w.coll.blocking and not w.coll.join and w.coll.seq is not None and w.coll.group != world
                   and (w.coll.waiting_s or 0) >= wait_s]
        if len({w.coll.group for _, w in blocked}) < 2:
            return []
        out = []
        for i, (n1, w1) in enumerate(blocked):
            g1 = members(w1.coll.group, self.world_size) or set()
            for n2, w2 in blocked[i + 1:]:
                if n2 == n1 or w2.coll.group == w1.coll.group:
                    continue
                g2 = members(w2.coll.group, self.world_size) or set()
                if g1.intersection(w2.ranks) and g2.intersection(w1.ranks):
                    out.append((("cycle", w1.coll.group, w1.coll.seq, w2.coll.group, w2.coll.seq), frozenset((n1, n2))))
        return out

    def busy(self) -> tuple[int, ...]:
        return tuple(sorted(r for s, _ in self.nodes for r in s.busy))

    def summary(self, node: int, version: int, now: float, host: str | None = None,
                digests: tuple[Digests, ...] = ()) -> NodeSummary:
        """These nodes merged back into one summary, as of ``now`` (a group leader's post to the root): every
        age counts from ``now``, so the level above ages it as it ages a node's.  ``digests``: the codes its
        nodes sent since the leader's previous summary (``merge_digests``)."""
        ranks: list[int] = []
        live: list[int] = []
        progress = 0
        attempt, world = 0, None
        for s, _ in self.nodes:
            ranks += s.ranks
            live += s.live
            progress += s.progress
            attempt = max(attempt, s.attempt)
            world = world if world is not None else s.world_size
        by_seq: dict[tuple, list[int]] = {}
        for r, seq in self.finished():
            by_seq.setdefault(tuple(sorted(seq.items())), []).append(r)
        d = self.deadline
        return NodeSummary(
            node=node, version=version, t=round(now, 3), host=host, attempt=attempt, world_size=world,
            ranks=tuple(sorted(ranks)), live=tuple(sorted(live)), failed=self.failed,
            finished=tuple(Finished(dict(k), tuple(rs)) for k, rs in by_seq.items()),
            waiting=tuple(Waiting(c, tuple(sorted(rs))) for c, rs in self.waiting().values()),
            outside=tuple(self.outside()), busy=self.busy(),
            progress_age_s=_r(self.progress_age), active_age_s=_r(self.active_age),
            first_t=None if self.first_age is None else round(now - self.first_age, 3), progress=progress,
            deadline=None if d is None else Deadline(d.rank, d.coll, d.timeout_s),
            step_p90_s=self.step_p90, step_n=self.step_n, desync=self.desync, digests=digests,
            lost=self.lost, late=len(self.late))


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def merge_digests(ds) -> tuple[Digests, ...]:
    """Several nodes' digests as one summary carries them: per group and position the union of the codes
    (one code where the nodes agree), consecutive positions in one record."""
    book: dict[str, dict[int, set[int]]] = {}
    for d in ds:
        g = book.setdefault(d.group, {})
        for i, codes in enumerate(d.codes):
            g.setdefault(d.first + i, set()).update(codes)
    out: list[Digests] = []
    for group in sorted(book, key=str):
        seqs = sorted(book[group])
        start = 0
        for i in range(1, len(seqs) + 1):
            if i == len(seqs) or seqs[i] != seqs[i - 1] + 1:
                run = seqs[start:i]
                out.append(Digests(group, run[0], tuple(tuple(sorted(book[group][q])) for q in run)))
                start = i
    return tuple(out)


def _later(a, b) -> bool:
    return pg_slack(a.coll.waiting_s or 0, a.timeout_s) > pg_slack(b.coll.waiting_s or 0, b.timeout_s)


class CrossCheck:
    """The root's book of fingerprint codes per (group, position), first come."""

    KEEP = 2048       # positions kept per group behind the newest

    def __init__(self) -> None:
        self.book: dict[str, dict[int, tuple[tuple[int, ...], int]]] = {}   # group -> seq -> (codes, node)
        self.top: dict[str, int] = {}
        self.cleared: set[tuple] = set()

    def feed(self, s: NodeSummary) -> list[tuple[str, Any, frozenset[int]]]:
        """Compare a node's new codes with the book: [(what, where, the nodes to pull)] to prove or clear."""
        out: list[tuple[str, Any, frozenset[int]]] = []
        node = s.node
        for d in s.digests:
            book = self.book.setdefault(d.group, {})
            for i, codes in enumerate(d.codes):
                if not codes:
                    continue
                seq = d.first + i
                have = book.get(seq)
                if have is None:
                    book[seq] = (codes, node)
                    continue
                if have[0] == codes:
                    continue
                if any(codes_differ(a, b) for a in codes for b in have[0]):
                    key = (d.group, seq, have[0], codes)
                    if key not in self.cleared:
                        out.append(("fingerprint", key, frozenset((have[1], node))))
            top = d.first + len(d.codes) - 1
            if top > self.top.get(d.group, -1):
                self.top[d.group] = top
                if len(book) > 2 * self.KEEP:
                    for k in [k for k in book if k < top - self.KEEP]:
                        del book[k]
        return out

    def clear(self, key) -> None:
        """A suspicion the pulled fingerprints did not prove: never pull for it again."""
        self.cleared.add(key)

