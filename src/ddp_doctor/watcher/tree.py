"""The tree of watchers (very large jobs): node agents report to their group's leader, the leaders to the root.

With one root reading every node, the root's store and loop grow with the nodes (12,500 nodes of 8 ranks:
the next wall).  Here the nodes are cut into groups of ``group_size`` consecutive node ranks; the first
live node of a group *leads* it: it hosts the group's store, reads its nodes' summaries exactly as the root
reads nodes (``root.Root``: one ``multi_get`` per interval, the compact delta decoding, the cross-node check
of fingerprint codes, the confirming pulls, late and lost nodes) and posts one summary of the group up
(``JobView.summary``: the same merge, applied again), through the same ``uplink.Uplink`` a node uses.  The
root cannot tell a leader from a node.  So a mismatch, a stall or a lost node is proven at the lowest level
that sees it (a node's own ranks: the node; two nodes of a group: their leader; two groups: the root) and
the proof travels up inside the summaries (``NodeSummary.desync`` / ``lost`` / ``late``).

Pulls travel down: a leader asked for ranks' full states (``Pull.ranks``) asks the nodes of its group that
hold them and answers with their states together (on its own clock).  The root's stop travels down in
each leader's control message.

A lost leader: a node whose posts to its leader have failed for ``FAILOVER_S`` moves on to the group's next
node (in node-rank order; never back), and the first of them leads from then on: every node of the group
then posts its whole state afresh to it (a new base, the last ``summary.WINDOW`` positions' codes again), so
the group's evidence survives its leader.  The root drops the silent leader's summary once the new leader
reports its ranks, and keeps the rest (the dead leader's own node: late, then lost).

Wiring (which store is where) is the caller's: ``connect(node_rank)`` gives a channel to that node's group
store, ``up()`` a fresh ``Uplink`` to the root store.  ``connect`` may answer None while the node has not said
where its store is (no failover for that).  ``ddp-doctor run`` builds it from the rendezvous;
``benchmarks/scale.py`` simulates 100,000 ranks with it.
"""
from __future__ import annotations

from typing import Any, Callable

from ddp_doctor import store as side
from ddp_doctor.diagnose.jobview import JobView, merge_digests
from ddp_doctor.evidence import Control, NodeDetail, NodeSummary, Pull
from ddp_doctor.watcher.root import Root
from ddp_doctor.watcher.uplink import Uplink

GROUP_SIZE = 16     # nodes per group (the root of 100,000 ranks in nodes of 8 then reads 782 leaders)
FAILOVER_S = 2.0    # a leader that has taken no post for this long is replaced by the group's next node
FORWARD_S = 3.0     # a leader waits this long for its nodes' answers to a pull it passes on


def group_of(node_rank: int, nnodes: int, size: int = GROUP_SIZE) -> list[int]:
    """The node ranks of ``node_rank``'s group, in the order they lead it."""
    g = node_rank // size
    return list(range(g * size, min(nnodes, (g + 1) * size)))


def publish_address(root: Any, node_rank: int, address: str) -> None:
    """Say on the root store where this node hosts its group store (once, at start)."""
    root.set(side.group_addr_key(node_rank), address)


def address_of(root: Any, node_rank: int) -> str | None:
    """Where ``node_rank`` hosts its group store (None until it said so)."""
    try:
        raw = root.peek(side.group_addr_key(node_rank))
    except Exception:
        return None
    return None if raw is None else raw.decode()


class Leader:
    """A group's leader: its nodes' summaries in (``root.Root`` over the group store), one summary up."""

    def __init__(self, group: Any, reader: Any, up: Uplink, world_size: int, slot: int,
                 host: str | None = None, t0: float | None = None) -> None:
        self.root = Root(group, reader, world_size, slot, t0=t0)
        self.root.fresh = []
        self.up = up
        self.host = host
        self.version = 0
        self.own_ranks: frozenset[int] = frozenset()   # this leader's own node's ranks
        self.job: JobView | None = None
        # a pull from above being answered: (its Pull, the group's own request, slots asked, give up at, own?)
        self.forwarding: tuple[Pull, int, set[int], float, bool] | None = None

    def tick(self, own: NodeSummary | None, own_views: dict, now: float,
             own_detail: Callable[[int, bool], NodeDetail] | None = None) -> Control | None:
        """One interval: read the group, merge, post up, pass the root's control message down.  Returns the
        root's control message when it changed (the caller obeys its stop)."""
        r = self.root
        r.read(now)
        if own is not None:
            own = own.with_(node=r.slot)
            r.own(own)
            self.own_ranks = frozenset(own.ranks)
        self.job = job = r.job_view(own, now)
        r.suspect_cycles(job)
        r.confirm(own_views, now)
        self.version += 1
        fresh, r.fresh = r.fresh, []
        merged = job.summary(self.up.slot if self.up.slot is not None else 0, self.version, now, self.host,
                             merge_digests(fresh))
        self.up.post(merged, now)
        ctl = self.up.control()
        if ctl is not None:
            if ctl.stop and r.ctl.stop != ctl.stop:
                r.stop(ctl.stop)
            pull = self.up.pull_for_me(ctl)
            if pull is not None:
                self._forward(pull, now)
        self._answer(now, own_detail)
        return ctl

    def _forward(self, pull: Pull, now: float) -> None:
        r = self.root
        want = set(pull.ranks)
        node = r.node_of()
        slots = {k for k in r.slots if k not in r.lost} if not want else {node[x] for x in want if x in node}
        own = not want or bool(want & self.own_ranks)
        slots.discard(r.slot)
        req = r.request(slots, pull.stacks, pull.ranks) if slots else 0
        self.forwarding = (pull, req, slots, now + FORWARD_S, own)

    def _answer(self, now: float, own_detail: Callable[[int, bool], NodeDetail] | None) -> None:
        if self.forwarding is None:
            return
        pull, _req, slots, until, own = self.forwarding
        r = self.root
        r.collect()
        if any(k in r.wanted for k in slots) and now < until:
            return
        ranks: list = []
        for k in sorted(slots):
            d = r.details.get(k)
            if d is not None:
                ranks += r.on_root_clock(d)
        if own and own_detail is not None:
            ranks += own_detail(pull.req, pull.stacks).ranks
        if pull.ranks:
            want = set(pull.ranks)
            ranks = [st for st in ranks if st.rank in want] or ranks
        self.up.answer(NodeDetail(self.up.slot or 0, pull.req, self.host, tuple(ranks), t0=r.t0))
        self.forwarding = None


class GroupLink:
    """A node agent's link up the tree, in the place of an ``Uplink`` (the same calls): its posts go to its
    group's leader; when it leads, its own summary goes into its ``Leader`` in-process instead.

    ``me``: this node's rank; ``group``: its group's node ranks in leading order; ``connect(node_rank)``: a
    channel to that node's group store; ``store``/``reader``: this node's own group store (it leads there);
    ``up()``: an ``Uplink`` to the root store, made when this node starts to lead."""

    def __init__(self, me: int, group: list[int], connect: Callable[[int], Any], store: Any, reader: Any,
                 up: Callable[[], Uplink], world_size: int, host: str | None = None, t0: float | None = None,
                 own_views: Callable[[], dict] | None = None,
                 own_detail: Callable[[int, bool], NodeDetail] | None = None) -> None:
        self.me, self.group = me, list(group)
        self.connect, self.store, self.reader, self.make_up = connect, store, reader, up
        self.world_size, self.host, self.t0 = world_size, host, t0
        self.own_views = own_views or dict
        self.own_detail = own_detail
        self.at = 0                       # index into ``group`` of the leader this node posts to
        self.link: Uplink | None = None   # to that leader (None while this node leads)
        self.leader: Leader | None = None
        self.ok_t: float | None = None    # the last post the leader took
        self.failovers = 0
        self.ctl: Control | None = None   # from the leader's tick: handed out by ``control``
        self.on_failover: Callable[[], None] | None = None  # (the node's summarizer resends its window)

    @property
    def slot(self) -> int | None:
        return self.leader.root.slot if self.leader is not None else (self.link.slot if self.link else None)

    @property
    def leading(self) -> bool:
        return self.group[self.at] == self.me

    def _lead(self) -> Leader:
        if self.leader is None:
            slot = int(self.store.add(side.NODES, 1)) - 1
            self.leader = Leader(self.store, self.reader, self.make_up(), self.world_size, slot, self.host, self.t0)
        return self.leader

    def post(self, summary: NodeSummary, now: float) -> bool:
        if self.leading:
            self.ctl = self._lead().tick(summary, self.own_views(), now, self.own_detail)
            return True
        if self.link is None:
            ch = self.connect(self.group[self.at])
            if ch is None:
                return False  # (its leader has not said where it is yet: not a failure)
            self.link = Uplink(ch)
        if self.link.post(summary, now):
            self.ok_t = now
            return True
        self.ok_t = now if self.ok_t is None else self.ok_t
        if now - self.ok_t >= FAILOVER_S:  # the leader is gone: the group's next node leads from now on
            self.at += 1
            self.failovers += 1
            self.link, self.ok_t = None, None
            if self.on_failover is not None:
                self.on_failover()
        return False

    def control(self) -> Control | None:
        if self.leading:
            ctl, self.ctl = self.ctl, None
            return None if ctl is None else Control(ctl.version, ctl.stop)  # (its pulls are the leader's)
        return self.link.control() if self.link is not None else None

    def pull_for_me(self, ctl: Control) -> Pull | None:
        return None if self.leading or self.link is None else self.link.pull_for_me(ctl)

    def answer(self, detail: NodeDetail) -> bool:
        if self.leading:
            return self.leader is not None and self.leader.up.answer(detail)
        return self.link is not None and self.link.answer(detail)
