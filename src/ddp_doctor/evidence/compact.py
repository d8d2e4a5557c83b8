"""The compact delta encoding of node summaries on the side channel (JSON stays for reports and captures).

A :class:`~ddp_doctor.evidence.summary.NodeSummary` is encoded field by field as positional arrays: no key
names, rank lists as runs (``[[16, 23]]``), source lines as indices into a table the summary carries,
fingerprint digests as base64 of packed 64-bit codes.  The node posts a *delta*: only the fields that
differ from its *base*, a full encoding it keeps under a key of its own and replaces once a field has
settled at a new value (carried unchanged in ``SETTLED`` deltas in a row), or every ``REBASE_S``.  Fields
that change all the time (positions, ages, digests) stay in the deltas; the rest costs nothing per interval.  The root holds each node's base (it fetches a base
again only when a delta names a newer one) and decodes only the fields that changed since the previous
delta, so a summary that did not change costs it a comparison, not a parse.

Wire: base ``[base_id, v0, v1, ...]`` (every field, in ``FIELDS`` order); delta ``[base_id, i, v_i, j, v_j, ...]``.
"""
from __future__ import annotations

import base64
import binascii
import json
import os
import struct
from dataclasses import fields
from typing import Any

from ddp_doctor.evidence.job import NodeLoss, Verdict
from ddp_doctor.evidence.records import Collective, Site
from ddp_doctor.evidence.summary import (Deadline, Digests, Finished, NodeSummary, Outside, Waiting, ranges,
                                         unranges)

FIELDS = tuple(f.name for f in fields(NodeSummary)) + ("sites",)
_SITES = len(FIELDS) - 1
REBASE_S = 30.0
SETTLED = 25
MAX_SITES = 512


def _dumps(v: Any) -> bytes:
    return json.dumps(v, separators=(",", ":"), default=str).encode()


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(float(x), nd)


def pack_codes(codes: tuple[tuple[int, ...], ...]) -> Any:
    """Per-position code sets: base64 of one unsigned 64-bit code each (0: none) when every position has at
    most one, else the lists themselves."""
    if all(len(c) <= 1 for c in codes):
        raw = struct.pack(f">{len(codes)}Q", *(c[0] if c else 0 for c in codes))
        return base64.b64encode(raw).decode("ascii")
    return [list(c) for c in codes]


def unpack_codes(v: Any) -> tuple[tuple[int, ...], ...]:
    if isinstance(v, str):
        raw = binascii.a2b_base64(v)
        return tuple((x,) if x else () for x in struct.unpack(f">{len(raw) // 8}Q", raw))
    return tuple(tuple(int(x) for x in c) for c in v)


class Encoder:
    """A node agent's side: each summary -> (a new base to post first, or None; the delta)."""

    def __init__(self) -> None:
        self.sites: list[list] = []
        self._site_idx: dict[tuple, int] = {}
        self.base_id = 0
        self.base: list | None = None
        self.base_len = 0
        self.base_t = 0.0
        self.carried: dict[int, tuple[Any, int]] = {}   # field -> (value carried, deltas in a row)

    def _site(self, s: Site | None) -> int:
        if s is None:
            return -1
        k = (s.path, s.line, s.function, s.api)
        i = self._site_idx.get(k)
        if i is None:
            i = self._site_idx[k] = len(self.sites)
            self.sites.append(s.to_list())
        return i

    def _coll(self, c: Collective) -> list:
        return [c.group, c.seq, c.op, self._site(c.site), _r(c.waiting_s), int(c.blocking) | (2 if c.join else 0)]

    def values(self, s: NodeSummary) -> list:
        """The summary's compact field values, in ``FIELDS`` order."""
        if len(self.sites) > MAX_SITES:  # a fresh table (and so a fresh base) now and then
            self.sites, self._site_idx, self.base = [], {}, None
        v = [s.node, s.version, round(s.t, 3), s.host, s.attempt, s.world_size, ranges(s.ranks), ranges(s.live), ranges(s.failed),
             [[dict(f.seq), ranges(f.ranks)] for f in s.finished],
             [self._coll(w.coll) + [ranges(w.ranks)] for w in s.waiting],
             [[o.rank, self._site(o.where), _r(o.idle_s, 2)] for o in s.outside],
             ranges(s.busy), _r(s.progress_age_s), _r(s.active_age_s), _r(s.first_t), s.progress,
             None if s.deadline is None else [s.deadline.rank, *self._coll(s.deadline.coll), s.deadline.timeout_s],
             _r(s.step_p90_s, 5), s.step_n, None if s.desync is None else s.desync.to_json(),
             [[d.group, d.first, pack_codes(d.codes)] for d in s.digests],
             [x.to_json() for x in s.lost], s.late]
        v.append([list(x) for x in self.sites])
        return v

    def encode(self, s: NodeSummary, now: float) -> tuple[bytes | None, bytes]:
        vals = self.values(s)
        if self.base is not None and now - self.base_t < REBASE_S:
            flat: list = [self.base_id]
            settled = False
            carried: dict[int, tuple[Any, int]] = {}
            for i, (a, b) in enumerate(zip(vals, self.base)):
                if a != b:
                    flat += [i, a]
                    prev = self.carried.get(i)
                    n = prev[1] + 1 if prev is not None and prev[0] == a else 1
                    carried[i] = (a, n)
                    settled = settled or n >= SETTLED
            self.carried = carried
            if not settled:
                return None, _dumps(flat)
        self.base_id += 1
        self.base = vals
        self.base_t = now
        self.carried = {}
        base = _dumps([self.base_id, *vals])
        self.base_len = len(base)
        return base, _dumps([self.base_id])


def _site_of(table: list, i) -> Site | None:
    return table[i] if isinstance(i, int) and 0 <= i < len(table) else None


def _coll_of(v: list, table: list) -> Collective:
    g, seq, op, si, waited, flags = v[:6]
    return Collective(g, seq, op, site=_site_of(table, si), waiting_s=waited, join=bool(flags & 2),
                      blocking=bool(flags & 1))


_DECODE = {
    "ranks": lambda v, t: unranges(v), "live": lambda v, t: unranges(v), "failed": lambda v, t: unranges(v),
    "busy": lambda v, t: unranges(v),
    "finished": lambda v, t: tuple(Finished(dict(sq), unranges(rs)) for sq, rs in v),
    "waiting": lambda v, t: tuple(Waiting(_coll_of(w, t), unranges(w[6])) for w in v),
    "outside": lambda v, t: tuple(Outside(int(r), _site_of(t, si), float(idle)) for r, si, idle in v),
    "deadline": lambda v, t: None if v is None else Deadline(int(v[0]), _coll_of(v[1:], t), float(v[7])),
    "desync": lambda v, t: Verdict.from_json(v),
    "digests": lambda v, t: tuple(Digests(g, int(first), unpack_codes(c)) for g, first, c in v),
    "lost": lambda v, t: tuple(NodeLoss.from_json(x) for x in v),
}


class Decoder:
    """The root's side, one per node: deltas -> summaries, against the base it holds."""

    def __init__(self) -> None:
        self.base_id: int | None = None
        self.base: list | None = None
        self.cur: list | None = None       # the raw field values of the last summary
        self.objs: dict[str, Any] = {}     # their decoded values
        self.summary: NodeSummary | None = None
        self.sites: list[Site] | None = None   # the decoded sites table
        self.table_raw: Any = None
        self.raw: dict[int, Any] = {}          # field -> the raw value its decoded object is of
        self.carried: set[int] = set()         # the fields the previous delta carried

    @staticmethod
    def base_of(delta: bytes) -> tuple[int, list]:
        """(the base id a delta needs, the parsed delta)."""
        flat = json.loads(delta)
        return int(flat[0]), flat

    def set_base(self, raw: bytes) -> int:
        flat = json.loads(raw)
        self.base_id, self.base = int(flat[0]), list(flat[1:])
        self.cur = None
        self.sites = None
        self.carried = set()
        return self.base_id

    def decode(self, flat: list) -> NodeSummary | None:
        """The summary of a parsed delta (None when it needs a base this decoder does not hold).  Only the
        fields this delta or the previous one carried can differ from the previous summary."""
        if self.base is None or int(flat[0]) != self.base_id or len(self.base) != len(FIELDS):
            return None
        changed = {int(flat[k]): flat[k + 1] for k in range(1, len(flat) - 1, 2) if 0 <= int(flat[k]) < len(FIELDS)}
        prev = self.cur
        if prev is None:  # a new base: every field
            todo = range(len(FIELDS))
            vals = list(self.base)
        else:
            todo = set(changed) | self.carried
            vals = prev
        for i in todo:
            vals[i] = changed.get(i, self.base[i])
        self.carried = set(changed)
        self.cur = vals
        objs = self.objs
        if prev is None or _SITES in todo and self.table_raw != vals[_SITES]:
            self.table_raw = vals[_SITES]
            self.sites = [Site.from_json(x) for x in vals[_SITES]]
            todo = range(len(FIELDS) - 1)   # indices into a new table: decode every field again
            self.raw = {}
        table = self.sites
        raw = self.raw
        for i in todo:
            if i == _SITES:
                continue
            v = vals[i]
            name = FIELDS[i]
            if name in objs and i in raw and raw[i] == v:
                continue
            raw[i] = v
            fn = _DECODE.get(name)
            objs[name] = fn(v, table) if fn is not None else v
        self.summary = NodeSummary(**objs)
        return self.summary


# -- a rank's posts to its node agent -----------------------------------------------------------------------
RING_DELTA = 256      # fingerprints a delta may carry before the rank posts a new base
STATE_REBASE_S = 30.0


def _fp_line(c: Collective) -> bytes:
    return _dumps([c.group, c.seq, c.op, list(c.shapes), list(c.dtypes), None if c.site is None else c.site.to_list(),
                   c.epoch, c.step_in_epoch, int(c.join)])


def _fps_of(lines: list[bytes], sites: dict) -> tuple[Collective, ...]:
    """Fingerprint lines -> records, in one parse; ``sites``: the decoder's Site objects by their list."""
    if not lines:
        return ()
    out = []
    for g, seq, op, sh, dt, site, ep, st, j in json.loads(b"[" + b",".join(lines) + b"]"):
        k = None if site is None else tuple(site)
        s = sites.get(k)
        if s is None and k is not None:
            s = sites[k] = Site.from_json(site)
        out.append(Collective(g, seq, op, tuple(sh), tuple(dt), s, None, None, ep, st, bool(j)))
    return tuple(out)


def _new_base_id() -> int:
    """A base id no earlier process of this rank used: a restarted rank (torch's ``--max-restarts``) posts
    under the same key, and its first delta must never be read against its predecessor's base."""
    return int.from_bytes(os.urandom(4), "big") << 20


class StateEncoder:
    """A rank's side of its posts to its node agent (``probe.publisher``): a *base* now and then, and per
    interval a *delta*: the top-level wire fields (``RankState.to_json`` without the ring) that differ from
    the base's (a few counters, ~150 bytes), then one line per fingerprint issued since the base -- never the
    ring of 256 again, never the full state's JSON per interval.

    Wire (``\n``-separated lines; the first is JSON, each further line one fingerprint):
    base ``[base_id, {fields}]`` + the ring's lines, under ``store.state_base_key``;
    delta ``[base_id, {changed fields}]`` (``[base_id, {...}, [removed fields]]`` when a field the base has is
    gone) + the lines since the base, under the rank's key.  A delta's lines only grow until the next base, so
    the agent parses only the lines it has not seen (``StateDecoder``) and a post it missed loses nothing."""

    def __init__(self) -> None:
        self.base_id = _new_base_id()
        self.light: dict | None = None        # the base's wire fields without its ring
        self.top: tuple | None = None         # (group, seq) of the newest fingerprint posted
        self.lines: list[bytes] = []          # the fingerprints issued since the base, encoded once
        self.base_t = 0.0

    def reset(self) -> None:
        """The base may not have reached the store: post a new one next time."""
        self.light = None

    def encode(self, st, now: float, extra: dict | None = None) -> tuple[bytes | None, bytes]:
        """(a new base to post first, or None; the delta).  ``extra``: wire fields beside the state's own."""
        ring = st.fingerprints
        new: tuple | None = ()
        if self.top is None and self.light is not None and ring:
            new = ring  # the base held none: every fingerprint since is new (the ring keeps the newest only)
            if len(ring) >= RING_DELTA:
                new = None
        elif self.top is not None and ring and (ring[-1].group, ring[-1].seq) != self.top:
            for i in range(len(ring) - 1, -1, -1):
                if (ring[i].group, ring[i].seq) == self.top:
                    new = ring[i + 1:]
                    break
            else:
                new = None  # the newest posted fell off the ring: a new base
        light = st.with_(fingerprints=()).to_json()
        if extra:
            light.update(extra)
        if self.light is None or new is None or len(self.lines) + len(new) > RING_DELTA \
                or now - self.base_t >= STATE_REBASE_S:
            self.base_id += 1
            self.light, self.lines, self.base_t = light, [], now
            self.top = (ring[-1].group, ring[-1].seq) if ring else None
            base = b"\n".join([_dumps([self.base_id, light]), *(_fp_line(c) for c in ring)])
            return base, _dumps([self.base_id, {}])
        if new:
            self.lines += [_fp_line(c) for c in new]
            self.top = (new[-1].group, new[-1].seq)
        base = self.light
        head = [self.base_id, {k: v for k, v in light.items() if base.get(k) != v}]
        removed = [k for k in base if k not in light]
        if removed:
            head.append(removed)
        return None, b"\n".join([_dumps(head), *self.lines])


_GONE = object()   # a wire key a delta says is no longer there
_SCALARS: frozenset = frozenset()   # (``_scalars``, filled with the table)


def _scalars() -> frozenset[str]:
    """The RankState fields whose wire value, a number or text, is the field's value as ``from_json`` makes it."""
    from ddp_doctor.evidence.rank import _PLAIN_FIELDS, RankState

    hints = {f.name: str(f.type) for f in fields(RankState)}
    simple = {"int", "float", "bool", "str", "int | None", "float | None", "str | None"}
    return frozenset(k for k in _PLAIN_FIELDS if hints.get(k) in simple)


def _wire_fields() -> dict[str, tuple[tuple[str, ...], tuple[str, ...]]]:
    """Each top-level wire key of ``RankState.to_json`` -> (the RankState fields it makes, the wire keys
    ``from_json`` reads together with it to make them)."""
    from ddp_doctor.evidence.rank import _PLAIN_FIELDS, PERF_KEYS

    out = {k: ((k,), (k,)) for k in _PLAIN_FIELDS}
    tabled = ("sites", "site_counts", "not_member")
    out.update({k: (("site_counts", "not_member"), tabled) for k in tabled})
    out.update({k: (("perf",), PERF_KEYS) for k in PERF_KEYS})
    out["collectives"] = (("coll_count", "coll_time_s"), ("collectives",))
    out["sites_seen"] = (("sites_seen",), ("sites_seen",))
    out["group"] = (("group",), ("group",))
    return out


class StateDecoder:
    """The node agent's side, one per rank: deltas -> ``RankState``, against the base it holds.  A delta costs
    the parse of its first line, the records of the fields whose wire value changed since the previous delta
    (the rest is the base's, or the previous delta's, decoded once) and the fingerprint lines not seen yet; an
    unchanged delta gives the previous state back."""

    _FIELDS: dict | None = None

    def __init__(self) -> None:
        self.base_id: int | None = None
        self.light: dict | None = None
        self.base_state = None                 # the base's fields as a record (its ring apart)
        self.kw: dict = {}                     # ... field by field
        self.ring: tuple = ()                  # the base's ring
        self.extra: tuple = ()                 # the fingerprints of this base's deltas so far
        self.body_len = 0                      # ... the length of their lines
        self.sites: dict = {}                  # their call sites, one object each
        self.head = b""                        # the last delta's first line
        self.wire: dict = {}                   # its wire values that differ from the base's
        self.made: dict = {}                   # the fields those make, decoded
        self.last: tuple[bytes, Any] | None = None

    @staticmethod
    def base_of(delta: bytes) -> int:
        return int(json.loads(delta[:delta.index(b",")] + b"]")[0])

    def set_base(self, raw: bytes) -> int | None:
        """Hold the base ``raw``; its id, or None for text that is not a base of this schema (never misread)."""
        from ddp_doctor.evidence.rank import RankState
        from ddp_doctor.evidence.records import SCHEMA

        head, *lines = raw.split(b"\n")
        bid, light = json.loads(head)
        if not isinstance(light, dict) or light.get("schema") != SCHEMA:
            return None
        self.base_state = RankState.from_json(light, ())
        self.kw = {f.name: getattr(self.base_state, f.name) for f in fields(RankState)}
        self.base_id, self.light, self.last = int(bid), light, None
        self.extra, self.body_len, self.head, self.wire, self.made = (), 0, b"", {}, {}
        self.ring = _fps_of(lines, self.sites)
        return self.base_id

    def _fields(self, changed: dict, removed: list) -> None:
        """``made``: the RankState fields that differ from the base's, for a delta's changed and removed wire
        keys; only the keys whose value moved since the previous delta are decoded again."""
        from ddp_doctor.evidence.rank import RankState

        global _SCALARS
        table = StateDecoder._FIELDS
        if table is None:
            table = StateDecoder._FIELDS = _wire_fields()
            _SCALARS = _scalars()
        wire = dict(changed)
        wire.update((k, _GONE) for k in removed)
        moved = [k for k, v in wire.items() if k not in self.wire or self.wire[k] != v]
        moved += [k for k in self.wire if k not in wire]            # back at the base's value
        if not moved:
            return
        base = self.light
        redo: set[str] = set()
        part = {"rank": base["rank"]}
        made = self.made
        for k in moved:
            got = table.get(k)
            if got is None:
                continue   # a key no field is made of ("schema", the channel's own counts)
            v = wire.get(k)
            if got[1] == (k,) and isinstance(v, (int, float, str)) and k in _SCALARS:
                if v == self.kw[k]:   # a number or text is its own record: no from_json
                    made.pop(k, None)
                else:
                    made[k] = v
                continue
            redo.update(got[0])
            for x in got[1]:
                v = wire.get(x, base.get(x, _GONE))
                if v is not _GONE:
                    part[x] = v
        if redo:
            rec = RankState.from_json(part, ())
            for f in redo:
                v = getattr(rec, f)
                if v == getattr(self.base_state, f):
                    made.pop(f, None)
                else:
                    made[f] = v
        self.wire = wire

    def _lines(self, body: bytes) -> None:
        """The fingerprints of a delta's lines (``body``) not parsed yet: a delta's lines only grow."""
        n = self.body_len
        if n and (len(body) < n or body[n:n + 1] not in (b"", b"\n")):
            self.extra, self.body_len, n = (), 0, 0   # (not the lines seen: parse them all again)
        if len(body) > n:
            self.extra += _fps_of(body[n + 1 if n else 0:].split(b"\n"), self.sites)
            self.body_len = len(body)

    def decode(self, raw: bytes):
        """The state of a delta; None when it needs a base this decoder does not hold."""
        from ddp_doctor.evidence.rank import RankState

        if self.last is not None and self.last[0] == raw:
            return self.last[1]
        i = raw.find(b"\n")
        head, body = (raw, b"") if i < 0 else (raw[:i], raw[i + 1:])
        if self.light is None:
            return None
        if head != self.head:
            h = json.loads(head)
            if int(h[0]) != self.base_id:
                return None
            self._fields(h[1], h[2] if len(h) > 2 else [])
            self.head = head
        self._lines(body)
        ring = (self.ring + self.extra)[-256:] if self.extra else self.ring
        kw = self.kw.copy()   # (dataclasses.replace asks every field of the base again: twice the time)
        kw.update(self.made)
        kw["fingerprints"] = ring
        st = RankState(**kw)
        self.last = (raw, st)
        return st
