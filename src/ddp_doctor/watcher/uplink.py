"""A node agent's link to the root (several nodes): its summary up every poll, the root's control message down.

Per interval a node makes one request to the root store (its summary's delta; the base now and then) and,
every ``CTL_EVERY``-th interval, one more (the control message): with the root's single read of every
node's summary that is 1.5 requests per node per interval, whatever the number of ranks.  A rank's own
traffic never leaves its node: the ranks post to their agent's own store.
"""
from __future__ import annotations

import json
from typing import Any

from ddp_doctor import store as side
from ddp_doctor.evidence import Control, NodeDetail, NodeSummary, Pull
from ddp_doctor.evidence.compact import Encoder

CTL_EVERY = 2


class Uplink:
    """One node's side (see the module doc).  ``channel``: a client of the root store (``store.join_store``)."""

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.slot: int | None = None
        self.encoder = Encoder()
        self.n = 0
        self.ctl_raw: bytes | None = None
        self.handled = 0

    def register(self) -> int | None:
        """This node's slot on the root store (taken once; None while the root store cannot be reached)."""
        if self.slot is None:
            try:
                self.slot = int(self.channel.add(side.NODES, 1)) - 1
            except Exception:
                return None
        return self.slot

    def post(self, summary: NodeSummary, now: float) -> bool:
        """Post the summary (as a delta against this node's base).  False when the channel dropped it."""
        if self.register() is None:
            return False
        if summary.node != self.slot:
            summary = summary.with_(node=self.slot)
        base, delta = self.encoder.encode(summary, now)
        try:
            if base is not None:
                self.channel.set(side.node_base_key(self.slot), base)
            self.channel.set(side.node_key(self.slot), delta)
            return True
        except Exception:
            if base is not None:
                self.encoder.base = None  # the base may not have landed: send a new one next time
            return False

    def control(self) -> Control | None:
        """The root's control message when it changed (read every ``CTL_EVERY``-th call)."""
        self.n += 1
        if self.slot is None or self.n % CTL_EVERY:
            return None
        try:
            raw = self.channel.peek(side.CTL)
        except Exception:
            return None
        if raw is None or raw == self.ctl_raw:
            return None
        self.ctl_raw = raw
        try:
            return Control.from_json(json.loads(raw))
        except ValueError:
            return None

    def pull_for_me(self, ctl: Control) -> Pull | None:
        p = ctl.pulls.get(self.slot) if self.slot is not None else None
        return p if p is not None and p.req > self.handled else None

    def answer(self, detail: NodeDetail) -> bool:
        """Post the full states answering a pull (``req`` 0: the node's last word)."""
        if self.slot is None:
            return False
        self.handled = max(self.handled, detail.req)
        try:
            self.channel.set(side.detail_key(self.slot, detail.req),
                             json.dumps(detail.to_json(), separators=(",", ":"), default=str), deadline=10.0)
            return True
        except Exception:
            return False
