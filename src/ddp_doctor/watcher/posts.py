"""The ranks' posts as a node agent reads them: every rank's latest post in as few requests as it can, and each
decoded -- a full state (a rank's final one, or one answering a stack request), or a compact delta read
against the base its rank keeps beside it (``compact.StateDecoder``: only what changed is parsed)."""
from __future__ import annotations

from ddp_doctor import store as side
from ddp_doctor.evidence import RankState, rank_state_from_wire
from ddp_doctor.evidence.compact import StateDecoder


class RankPosts:
    """Reads and decodes the ranks' posts from one (signed) store."""

    def __init__(self, store) -> None:
        self.store = store
        self.last_raw: dict[str, bytes] = {}         # key -> the post last read (read once, however often polled)
        self.decoders: dict[str, StateDecoder] = {}  # key -> its rank's base and what its deltas added
        self.batched = True                          # every rank's post read in one request (``read``)

    def peek(self, key: str) -> bytes | None:
        """The verified value of ``key``, None when absent or refused: one request."""
        try:
            return self.store.peek(key)
        except Exception:
            return None

    def state_of(self, key: str, raw: bytes) -> RankState | None:
        """A rank's post as its state; None for anything else, and for a delta whose base is not there yet (a
        newer one: read next time)."""
        if raw[:1] == b"{":
            return rank_state_from_wire(raw.decode())
        dec = self.decoders.get(key)
        if dec is None:
            dec = self.decoders[key] = StateDecoder()
        try:
            st = dec.decode(raw)
            if st is None:   # a base it does not hold yet
                base = self.peek(side.state_base_key(key))
                if base is None or dec.set_base(base) is None:
                    return None
                st = dec.decode(raw)
            return st
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return None   # not a post of this schema: never misread

    def read(self, keys: list[str]) -> list[bytes | None]:
        """The ranks' posts.  Once every rank has posted: two requests (are they all there; all of them), not
        one per rank -- the round trips were most of a node agent's CPU.  A key gone since (only a stranger
        deletes one: the store's ``multi_get`` would wait for it) ends the batching for good."""
        if self.batched and keys and all(k in self.last_raw for k in keys):
            try:
                if self.store.present(keys):
                    return self.store.multi_get(keys)
            except Exception:
                self.batched = False
        return [self.peek(k) for k in keys]
