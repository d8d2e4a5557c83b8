"""The root of hierarchical watching (several nodes): every node's summary in, the job's view out, pulls.

Runs in the watcher of the node that hosts the root store.  Each poll it reads every node's summary in
one request (``multi_get`` of the nodes' delta keys; a node's base only when its delta names a newer
one), decodes what changed (``evidence.compact``), feeds the fingerprint codes to the cross-node check
and hands the policy a :class:`~ddp_doctor.diagnose.jobview.JobView` of all nodes, its own included
(made in-process, not read back).  The root asks nodes for their ranks' full states through the
control message (``evidence.Control``): to prove or clear a cross-node difference of fingerprint codes
(``live.find_desync`` over the pulled fingerprints), and, once it has decided, for the stacks and states
the diagnosis reads -- from every node of a small job, from the suspected nodes of a large one (the
others' ranks are represented by what their summaries say).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace
from typing import Any, Callable

from ddp_doctor import store as side
from ddp_doctor.diagnose.jobview import LATE_S, LOST_S, CrossCheck, JobView
from ddp_doctor.diagnose.live import CYCLE_S, find_desync, group_ranks
from ddp_doctor.evidence import GROUP_CREATION, Control, NodeDetail, NodeLoss, NodeSummary, Pull, RankState, Verdict
from ddp_doctor.evidence.compact import Decoder
from ddp_doctor.watcher.views import RankView

DETAIL_ALL = 64        # jobs up to this many ranks: every node's full states for the report
SUSPECTS_MAX = 16      # larger jobs: full states from at most this many suspected nodes
CONFIRM_S = 5.0        # a node that has not answered a confirmation pull by then: the suspicion is dropped
COUNT_EVERY_S = 1.0    # how often the root reads how many nodes have registered


def interval_for(nodes: int) -> float:
    """Seconds between two summaries of a node (and two reads of the root): 0.2 s up to 400 nodes, then
    0.5 ms per node (1,250 nodes: 0.625 s), so that the root store serves at most ~3,200 requests a second
    and the root's own work stays bounded (benchmarks/scale.py: 0.14 CPU core at 1,250 nodes)."""
    return max(0.2, round(0.0005 * nodes, 3))


class _Slot:
    __slots__ = ("dec", "raw", "summary", "t", "present", "offset")

    def __init__(self) -> None:
        self.dec = Decoder()
        self.raw: bytes | None = None
        self.summary: NodeSummary | None = None
        self.t = 0.0           # when the root first read the current summary
        self.present = False   # its delta key exists (it goes into the multi_get)
        # the node's clock -> the root's: the least (read time - made time) seen.  Its summaries' ages then
        # count from when they were made, never from before (the least delay is >= 0): conservative
        self.offset: float | None = None


class Root:
    """See the module doc.  ``channel`` writes the control message; ``reader`` (a client of its own, with
    a short timeout) makes the per-poll reads."""

    def __init__(self, channel: Any, reader: Any, world_size: int, slot: int,
                 clock: Callable[[], float] = time.monotonic, t0: float | None = None) -> None:
        self.channel = channel
        self.reader = reader
        self.world_size = world_size
        self.slot = slot                 # this node's own slot (never read back)
        self.clock = clock
        self.slots: dict[int, _Slot] = {}
        self.count_t = float("-inf")
        self.cross = CrossCheck()
        self.suspects: list[tuple[str, Any, frozenset[int]]] = []
        self.confirming: tuple[Any, frozenset[int], int, float] | None = None
        self.proof: Verdict | None = None
        self.ctl = Control()
        self.req = 0
        self.wanted: dict[int, int] = {}         # slot -> the pull it owes
        self.details: dict[int, NodeDetail] = {}  # slot -> its latest answer
        self.lost: dict[int, NodeLoss] = {}
        self.attempt = 0                          # torch's restart count of the ranks being judged
        self.t0 = t0                              # the wall-clock start this node's ranks count their times from
        self.fresh: list | None = None            # a group leader's: the digests its nodes sent since it last took them
        self.lost_s = LOST_S

    def begin_attempt(self, attempt: int) -> None:
        """torch's agents restarted the ranks (``--max-restarts``): what was known of the failed attempt goes."""
        self.attempt = attempt
        self.cross = CrossCheck()
        self.suspects, self.confirming, self.proof = [], None, None
        self.details, self.wanted = {}, {}

    # -- reading ---------------------------------------------------------------------------------
    def read(self, now: float) -> None:
        """Take every node's newest summary: one request for all, one more for the bases of the nodes that
        rebased since, one per node that has not posted yet."""
        if now - self.count_t >= COUNT_EVERY_S:
            self.count_t = now
            try:
                n = self.reader.add(side.NODES, 0)
            except Exception:
                n = 0
            for k in range(n):
                if k != self.slot and k not in self.slots:
                    self.slots[k] = _Slot()
        present = [k for k, sl in self.slots.items() if sl.present]
        got: list[tuple[int, bytes | None]] = []
        if present:
            try:
                got = list(zip(present, self.reader.multi_get([side.node_key(k) for k in present])))
            except Exception:  # a key went missing (deleted?): find out which, key by key
                got = [(k, self._peek(side.node_key(k))) for k in present]
                for k, raw in got:
                    self.slots[k].present = raw is not None
        for k, sl in self.slots.items():
            if not sl.present:
                raw = self._peek(side.node_key(k))
                if raw is not None:
                    sl.present = True
                    got.append((k, raw))
        rebased: list[tuple[int, bytes, int, list]] = []
        for k, raw in got:
            sl = self.slots[k]
            if raw is None or raw == sl.raw:
                continue
            try:
                base_id, flat = Decoder.base_of(raw)
            except (ValueError, TypeError, IndexError):
                continue
            if base_id != sl.dec.base_id:
                rebased.append((k, raw, base_id, flat))
            else:
                self._take(k, raw, flat, now)
        if rebased:
            keys = [side.node_base_key(k) for k, *_ in rebased]
            try:
                bases = self.reader.multi_get(keys)
            except Exception:
                bases = [self._peek(key) for key in keys]
            for (k, raw, base_id, flat), base in zip(rebased, bases):
                try:
                    if base is not None and self.slots[k].dec.set_base(base) == base_id:
                        self._take(k, raw, flat, now)
                except (ValueError, TypeError, IndexError):
                    pass  # (a node rebasing right now: its next delta names the new base)

    def _peek(self, key: str) -> bytes | None:
        try:
            return self.reader.peek(key)
        except Exception:
            return None

    def _take(self, k: int, raw: bytes, flat: list, now: float) -> None:
        sl = self.slots[k]
        before = sl.summary
        try:
            s = sl.dec.decode(flat)
        except (ValueError, TypeError, IndexError, KeyError):
            return
        if s is None:
            return
        sl.raw, sl.summary, sl.t = raw, s, now
        if sl.offset is None or (before is not None and before.host != s.host):  # (a new leader's clock)
            sl.offset = now - s.t
        sl.offset = min(sl.offset, now - s.t)
        self.lost.pop(k, None)
        if before is None or s.digests is not before.digests:
            self._suspect(self.cross.feed(s))
            if self.fresh is not None:
                self.fresh += s.digests

    def _suspect(self, found) -> None:
        for sus in found:
            if sus[1] not in {x[1] for x in self.suspects}:
                self.suspects.append(sus)

    def own(self, s: NodeSummary) -> None:
        """This node's own summary, made in-process (its codes go into the cross-node check too)."""
        self._suspect(self.cross.feed(s))
        if self.fresh is not None:
            self.fresh += s.digests

    def job_view(self, own: NodeSummary | None, now: float) -> JobView:
        nodes: list[tuple[NodeSummary, float]] = [(own, 0.0)] if own is not None else []
        late: list[int] = []
        slots = [(k, sl) for k, sl in self.slots.items()
                 if sl.summary is not None and sl.summary.attempt >= self.attempt]  # (ranks not restarted yet)
        owner = self._owners(own, slots)
        for k, sl in slots:
            s = sl.summary
            if owner is not None:
                mine = [r for r in s.ranks if owner.get(r) == k]
                if not mine and s.ranks:
                    self.lost.pop(k, None)
                    continue  # a group leader replaced: its nodes report through the group's next node
                if len(mine) < len(s.ranks):
                    s = s.only(mine)
            silent = now - sl.t
            if silent > self.lost_s and k not in self.lost:
                self.lost[k] = NodeLoss(k, s.host, s.ranks, round(silent, 1))
            elif LATE_S < silent <= self.lost_s:
                late.append(k)
            nodes.append((s, max(0.0, now - (s.t + sl.offset))))
        return JobView(self.world_size, nodes, late=tuple(late), lost=tuple(self.lost.values()), desync=self.proof)

    def _owners(self, own: NodeSummary | None, slots) -> dict[int, int] | None:
        """rank -> the slot that reports it, when some rank is reported by two (None: none is).  A group leader
        lost, its nodes move on to the group's next node, whose summary then holds their ranks too: a rank
        counts once, in the summary heard from last (a silent leader keeps only its own node's ranks)."""
        total = sum(len(sl.summary.ranks) for _, sl in slots) + (len(own.ranks) if own is not None else 0)
        if total <= self.world_size:
            return None
        owner: dict[int, int] = {}
        for k, sl in sorted(slots, key=lambda x: x[1].t):
            for r in sl.summary.ranks:
                owner[r] = k
        for r in own.ranks if own is not None else ():
            owner[r] = self.slot
        return owner

    def node_of(self) -> dict[int, int]:
        """rank -> node slot, from the summaries."""
        out = {}
        for k, sl in sorted(self.slots.items(), key=lambda x: x[1].t):  # (the newest report of a rank wins)
            if sl.summary is not None:
                for r in sl.summary.ranks:
                    out[r] = k
        return out

    # -- pulls -----------------------------------------------------------------------------------
    def _post_ctl(self) -> None:
        try:
            self.channel.set(side.CTL, json.dumps(self.ctl.to_json(), separators=(",", ":")))
        except Exception:
            pass

    def request(self, slots, stacks: bool, ranks=()) -> int:
        """Ask ``slots`` for their ranks' full states (``stacks``: take every stack first; ``ranks``: only
        these, where a slot is a group leader's)."""
        self.req += 1
        pulls = {k: p for k, p in self.ctl.pulls.items() if k in self.wanted}
        for k in slots:
            pulls[k] = Pull(self.req, stacks, tuple(sorted(ranks)))
            self.wanted[k] = self.req
        self.ctl = Control(self.ctl.version + 1, self.ctl.stop, pulls)
        self._post_ctl()
        return self.req

    def stop(self, reason: str) -> None:
        self.ctl = Control(self.ctl.version + 1, reason, dict(self.ctl.pulls))
        self._post_ctl()

    def collect(self) -> None:
        """Take the answers that arrived."""
        for k, req in list(self.wanted.items()):
            raw = self._peek(side.detail_key(k, req))
            if raw is None:
                continue
            try:
                self.details[k] = NodeDetail.from_json(json.loads(raw))
            except (ValueError, KeyError, TypeError):
                continue
            del self.wanted[k]
            try:
                self.channel.delete(side.detail_key(k, req))
            except Exception:
                pass

    def wait(self, slots, timeout_s: float) -> set[int]:
        """Wait (at most ``timeout_s``) for ``slots``' answers; the slots that did not answer."""
        end = time.monotonic() + timeout_s
        missing = set(slots)
        while True:
            self.collect()
            missing = {k for k in slots if k in self.wanted}
            if not missing or time.monotonic() >= end:
                return missing
            time.sleep(0.05)

    def mark_silent(self, slots, now: float) -> None:
        """Nodes that did not answer a pull and have not sent a summary for a while: lost."""
        for k in slots:
            sl = self.slots.get(k)
            if sl is not None and sl.summary is not None and now - sl.t > 1.0 and k not in self.lost:
                self.lost[k] = NodeLoss(k, sl.summary.host, sl.summary.ranks, round(now - sl.t, 1))

    def finals(self, timeout_s: float) -> None:
        """The end of the job: every node's last word (its agent posts it as its ranks end; small jobs)."""
        slots = [k for k in self.slots if k not in self.lost]
        for k in slots:
            self.wanted[k] = 0
        self.wait(slots, timeout_s)

    def suspect_cycles(self, job: JobView) -> None:
        """Ranks of two nodes that may be blocked waiting for each other (``JobView.cycle_pairs``)."""
        if self.proof is None and len(job.nodes) > 1:
            for key, nodes in job.cycle_pairs(group_ranks, GROUP_CREATION, CYCLE_S):
                if key not in self.cross.cleared:
                    self._suspect([("cycle", key, nodes)])

    def on_root_clock(self, d: NodeDetail) -> tuple[RankState, ...]:
        """A node's states with their times (``t``, an exception's ``t``) counted from this node's start, so
        that ranks of different nodes compare (which rank raised first, two waits that overlapped)."""
        shift = (d.t0 - self.t0) if d.t0 is not None and self.t0 is not None else 0.0
        if not shift:
            return d.ranks
        out = []
        for st in d.ranks:
            kw: dict[str, Any] = {}
            if st.t is not None:
                kw["t"] = round(st.t + shift, 3)
            if st.exc is not None and st.exc.t is not None:
                kw["exc"] = replace(st.exc, t=round(st.exc.t + shift, 3))
            out.append(st.with_(**kw) if kw else st)
        return tuple(out)

    # -- cross-node desync: suspected from codes, proven from pulled fingerprints -----------------
    def confirm(self, own_views: dict[int, Any], now: float) -> None:
        """One suspicion at a time: pull the two nodes' fingerprints, then ``find_desync`` proves or clears."""
        if self.proof is not None:
            return
        if self.confirming is None and self.suspects:
            _what, key, nodes = self.suspects.pop(0)
            remote = frozenset(nodes - {self.slot})
            self.confirming = (key, nodes, self.request(remote, stacks=False) if remote else 0, now)
        if self.confirming is None:
            return
        key, nodes, req, t0 = self.confirming
        self.collect()
        remote = nodes - {self.slot}
        if any(k in self.wanted for k in remote):
            if now - t0 > CONFIRM_S:
                self.cross.clear(key)
                self.confirming = None
            return
        views: dict[int, Any] = {}
        for k in remote:
            d = self.details.get(k)
            for st in self.on_root_clock(d) if d is not None else ():
                views[st.rank] = RankView.from_detail(st, now)
        if self.slot in nodes:
            views.update({r: v for r, v in own_views.items() if v.state is not None})
        found = find_desync(views, len(views))
        if found is not None:
            self.proof = found
        else:
            self.cross.clear(key)
        self.confirming = None

    # -- after a decision ------------------------------------------------------------------------
    def suspected(self, decision: Verdict, job: JobView) -> set[int]:
        """The nodes whose full states the diagnosis of ``decision`` needs (every node of a small job)."""
        if self.world_size <= DETAIL_ALL:
            return {k for k in self.slots if k not in self.lost}
        node = self.node_of()
        out = {node[r] for r in sorted(self.suspected_ranks(decision, job)) if r in node and node[r] not in self.lost}
        return set(sorted(out)[:SUSPECTS_MAX])

    def suspected_ranks(self, decision: Verdict, job: JobView) -> set[int]:
        """The ranks whose full states the diagnosis of ``decision`` needs (a large job): the failed, the
        ones outside collectives, the ones not at the most common position and one that is."""
        if self.world_size <= DETAIL_ALL:
            return set()
        ranks: set[int] = set(job.failed) | set(decision.calls)
        if decision.rank is not None:
            ranks.add(decision.rank)
        ranks |= {o.rank for o in job.outside()}
        waiting = job.waiting()
        if waiting:  # the ranks not at the most common position, and one rank that is
            common = max(waiting.values(), key=lambda cr: len(cr[1]))
            ranks.add(min(common[1]))
            for c, rs in waiting.values():
                if c is not common[0]:
                    ranks |= set(rs[:4])
        return ranks

    def remote_views(self, now: float) -> dict[int, RankView]:
        """Views of the ranks whose full states arrived from other nodes."""
        out = {}
        for d in self.details.values():
            for st in self.on_root_clock(d):
                out[st.rank] = RankView.from_detail(st, now)
        return out

    def light_states(self) -> dict[int, RankState]:
        """What the summaries say of the ranks no detail came for (large jobs): where each one is."""
        out: dict[int, RankState] = {}
        for sl in self.slots.values():
            s = sl.summary
            if s is None:
                continue
            for r in s.ranks:
                out[r] = RankState(rank=r, host=s.host, world_size=s.world_size, attempt=s.attempt)
            for w in s.waiting:
                for r in w.ranks:
                    out[r] = out[r].with_(in_collective=w.coll)
            for o in s.outside:
                out[o.rank] = out[o.rank].with_(where=o.where, idle_s=o.idle_s)
            for f in s.finished:
                for r in f.ranks:
                    out[r] = out[r].with_(done=True, seq=dict(f.seq))
            for r in s.busy:
                out[r] = out[r].with_(busy=True)
        return out
