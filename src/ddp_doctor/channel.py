"""The side channel between the probes and the watcher: signed messages, and store calls that never block.

Two guarantees, in one place for the publisher (in every rank), the watcher and the launcher:

* **Trust.**  torch's TCPStore has no authentication and its server listens on all interfaces, so
  anyone who reaches the port could post a rank's state (a forged exception would stop the job).
  Every value written with :meth:`SideChannel.set` is sealed with HMAC-SHA256 under a per-job
  secret and a per-writer sequence number; :meth:`SideChannel.get` / :meth:`SideChannel.check`
  drop a value that is unsigned, signed with another key, moved from another key, or older than
  one already read from that key (a replay), and count it.  The secret is made by the launcher
  (``ddp-doctor run``) and reaches the ranks in their environment (``DDP_DOCTOR_SECRET``), never
  the wire.  Counters (``add``) cannot be signed (the store adds to them), so they live under names
  derived from the secret (:meth:`SideChannel.counter_key`: a stranger cannot find them, the store
  lists no keys), and every ``add`` first reads the counter: a value there that is not an integer
  is refused and counted (reason ``not a counter``) instead of added to -- torch's store drops the
  connection of a client whose ``add`` meets text, which left the watcher blind for the rest of
  the job.  Should a connection of the store's host still be dropped by its own server (in-process:
  only a request the server refused), the host's channel connects afresh and records when
  (``ChannelStats.tampered``); one it cannot renew is lost from then (``lost_at``).
* **No blocking.**  A TCPStore client call blocks without limit when the server accepts but does
  not answer (a stopped process, a black-holed port), whatever its timeout says.  Here a client
  store's calls run on one daemon thread; the caller waits at most ``deadline`` seconds, and while
  a call is overdue or the client is still connecting, further calls are dropped and counted
  instead of queued.  A channel that cannot connect within ``give_up_s`` is lost for good (the
  probe records locally, training goes on).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import queue
import secrets
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

SECRET_ENV = "DDP_DOCTOR_SECRET"
_MAGIC = b"ddpd1"
MAX_KEYS_COUNTED = 256
OTHER_KEYS = "(other keys)"
_ABSENT, _NEVER = b"\x00", b"\x01"   # peek: no sealed value is b"\x00", so compare_set never writes


class ChannelDown(Exception):
    """The side channel cannot take this call now (behind, overdue, or lost): the message is dropped."""


class Rejected(Exception):
    """A value on the store failed verification (unsigned, forged or replayed)."""


def new_secret() -> str:
    return secrets.token_hex(32)


def job_secret() -> bytes | None:
    """This job's secret from the environment (set by ``ddp-doctor run``, or by the user on every node)."""
    s = os.environ.get(SECRET_ENV)
    return s.encode() if s else None


def ensure_job_secret(multi_node: bool) -> None:
    """Make this job's secret (``run`` and ``check``), handed to the ranks in their environment.

    One node: made here, per job.  Several nodes: every node's launcher needs the same key and
    there is no channel to share it secretly, so it must come from the user (``DDP_DOCTOR_SECRET``
    on every node); without it the side channel runs unauthenticated, and says so."""
    if os.environ.get(SECRET_ENV):
        return
    if multi_node:
        print(f"ddp-doctor: side channel unauthenticated (set the same {SECRET_ENV} on every node to sign it; "
              "see README 'Security model')", file=sys.stderr)
        return
    os.environ[SECRET_ENV] = new_secret()


def _mac(secret: bytes, key: str, seq: int, payload: bytes) -> str:
    """Keyed BLAKE2b, CPython's own (no OpenSSL): the probe signs in a background thread that releases the GIL
    while it hashes, and a DataLoader worker forked meanwhile inherits OpenSSL's locks as that thread held
    them -- its own first OpenSSL call (the resource sharer's HMAC handshake that passes a batch's tensors
    to the rank) could then wait forever.  BLAKE2b keeps no lock outside the object being hashed."""
    k = secret if len(secret) <= 64 else hashlib.blake2b(secret).digest()
    h = hashlib.blake2b(key.encode() + b"\n" + str(seq).encode() + b"\n", key=k, digest_size=32)
    h.update(payload)
    return h.hexdigest()


def seal(secret: bytes | None, key: str, seq: int, payload: bytes) -> bytes:
    """``ddpd1|seq|mac|payload``; the MAC covers the key too, so a value cannot be moved to another key."""
    mac = _mac(secret, key, seq, payload) if secret else "-"
    return b"|".join((_MAGIC, str(seq).encode(), mac.encode(), payload))


def unseal(secret: bytes | None, key: str, raw: bytes) -> tuple[int, bytes]:
    """(seq, payload) of a sealed value; raises Rejected(reason) when it does not verify."""
    parts = raw.split(b"|", 3)
    if len(parts) != 4 or parts[0] != _MAGIC:
        raise Rejected("unsigned")
    try:
        seq = int(parts[1])
    except ValueError:
        raise Rejected("malformed") from None
    if secret is not None and not hmac.compare_digest(parts[2].decode("ascii", "replace"), _mac(secret, key, seq, parts[3])):
        raise Rejected("bad signature")
    return seq, parts[3]


@dataclass
class ChannelStats:
    """What the channel dropped: the report's ``side_channel`` section."""

    authenticated: bool
    rejected: dict[str, int] = field(default_factory=dict)   # reason -> distinct values dropped
    rejected_keys: list[str] = field(default_factory=list)   # first few keys a bad value was found under
    rejected_by_key: dict[str, dict[str, int]] = field(default_factory=dict)  # key -> reason -> values dropped
    dropped: int = 0      # calls not made because the channel was behind, overdue or lost
    timeouts: int = 0     # calls that overran their deadline
    lost: bool = False    # gave up connecting: this side is unwatched
    connected: bool = True  # a client: has it ever reached the store?
    requests: int = 0     # store calls made (one multi_get is one)
    bytes_out: int = 0    # value bytes written
    bytes_in: int = 0     # value bytes read
    tampered: list[dict[str, Any]] = field(default_factory=list)  # the host's connection dropped by its server
    lost_at: float | None = None  # wall clock: when this side went unwatched for good (None: never)

    def to_dict(self) -> dict[str, Any]:
        return {"authenticated": self.authenticated, "rejected": dict(self.rejected),
                "rejected_keys": list(self.rejected_keys),
                "rejected_by_key": {k: dict(v) for k, v in self.rejected_by_key.items()}, "dropped": self.dropped,
                "timeouts": self.timeouts, "lost": self.lost or not self.connected,
                "tampered": [dict(t) for t in self.tampered], "lost_at": self.lost_at}


def _immortal(client: Any) -> Any:
    """Keep a client store alive to the very end: destroying one whose call is stuck on an unanswering
    server blocks the interpreter's exit (its destructor waits for that call); one leaked object per
    connection is the price of exiting at once."""
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(client))
    except Exception:
        pass
    return client


class _Worker:
    """One daemon thread that owns a client store and makes its calls (so a caller can stop waiting)."""

    def __init__(self, connect: Callable[[], Any], stats: ChannelStats, give_up_s: float) -> None:
        self.connect = connect
        self.stats = stats
        self.give_up_s = give_up_s
        self.client = None
        self.q: "queue.SimpleQueue[tuple]" = queue.SimpleQueue()
        self.busy = threading.Lock()   # held while a call (or the connect) is in progress
        self.first_try: float | None = None
        threading.Thread(target=self._loop, name="ddp-doctor-store-io", daemon=True).start()

    def _loop(self) -> None:
        while True:
            fn, done, box = self.q.get()
            try:
                if self.client is None:
                    self.first_try = self.first_try or time.monotonic()
                    self.client = _immortal(self.connect())
                    self.first_try = None
                    self.stats.connected = True
                box.append((True, fn(self.client)))
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                self.client = None  # a broken connection: connect afresh on the next call
                if self.first_try is not None and time.monotonic() - self.first_try > self.give_up_s:
                    self.stats.lost = True
                box.append((False, e))
            finally:
                self.busy.release()
                done.set()

    def call(self, fn: Callable[[Any], Any], deadline: float) -> Any:
        if self.first_try is not None and time.monotonic() - self.first_try > self.give_up_s:
            self.stats.lost = True  # still connecting (a port that accepts and never answers)
        if self.stats.lost:
            self.stats.dropped += 1
            raise ChannelDown("side channel lost")
        if not self.busy.acquire(blocking=False):
            self.stats.dropped += 1
            raise ChannelDown("side channel behind")
        done = threading.Event()
        box: list = []
        self.q.put((fn, done, box))
        if not done.wait(deadline):
            self.stats.timeouts += 1
            raise ChannelDown(f"side channel call overran {deadline:g}s")
        ok, value = box[0]
        if not ok:
            raise value
        return value


def _is_counter(raw: bytes) -> bool:
    """Would torch's store add to this value (a decimal int64; its ``stoll`` fails on anything else, and the
    store then drops the connection that asked)?  Kept well inside the range, so adding cannot overflow."""
    s = raw.strip()
    return s.lstrip(b"-").isdigit() and len(s) <= 17


def _alive(client: Any) -> bool:
    """Does a store client still answer (a key no one writes, asked without waiting)?"""
    try:
        client.check(["ddpd/alive?"])
        return True
    except Exception:  # noqa: BLE001 - a dropped connection, whatever torch calls it
        return False


class SideChannel:
    """A TCPStore seen through signatures (and, for a client, deadlines).  Same calls as a store."""

    def __init__(self, store: Any = None, *, connect: Callable[[], Any] | None = None,
                 secret: bytes | None = None, deadline: float = 2.0, give_up_s: float = 60.0,
                 log: Callable[[str], None] | None = None, renew: Callable[[], Any] | None = None) -> None:
        self.secret = secret
        self._renew = renew   # the host's channel: a fresh client of its own server, when one is dropped
        self.stats = ChannelStats(authenticated=secret is not None)
        self._store = store
        self.server = store   # a hosted store's server lives as long as this object does, after a renewal too
        self._worker = _Worker(connect, self.stats, give_up_s) if connect is not None else None
        self.stats.connected = connect is None
        self.deadline = deadline
        # strictly increasing per writer, across restarts: torch's restart count, then the clock
        self._base = int(os.environ.get("TORCHELASTIC_RESTART_COUNT") or 0) << 64
        self._seq = 0
        self._seq_lock = threading.Lock()
        self._last: dict[str, int] = {}     # key -> newest seq read (replay guard)
        self._seen_bad: set[tuple[str, bytes]] = set()
        self._logged: set[tuple[str, str]] = set()  # (key, reason) already logged: each kind is said once
        self._log = log if log is not None else (lambda m: print(m, file=sys.stderr))
        self._closed = False

    def close(self) -> None:
        """Make no more calls (the store is going away: a call to a closed TCPStore makes torch's client print
        a C++ stack trace); later calls are dropped and counted."""
        self._closed = True

    @property
    def lost(self) -> bool:
        return self.stats.lost

    @property
    def connected(self) -> bool:
        return self.stats.connected

    def _call(self, fn: Callable[[Any], Any], deadline: float | None = None) -> Any:
        if self._closed:
            self.stats.dropped += 1
            raise ChannelDown("side channel closed")
        self.stats.requests += 1
        if self._worker is None:
            if self.stats.lost:
                self.stats.dropped += 1
                raise ChannelDown("side channel lost")
            try:
                return fn(self._store)
            except Exception as e:
                self._after_failure(e)
                raise
        return self._worker.call(fn, self.deadline if deadline is None else deadline)

    def _after_failure(self, error: Exception) -> None:
        """A call of a store held directly failed.  A timeout or a missing key leaves the connection usable;
        one the server dropped does not (every later call fails: the watcher would go blind, silently).  The
        host's own server is in this process and alive, so it dropped us over a request it refused -- a
        value someone else wrote: recorded as tampering, and a fresh client takes the dropped one's place.
        One that cannot be renewed leaves this side unwatched from now (``lost_at``), and says so."""
        if self._renew is None or _alive(self._store):
            return
        now = time.time()
        try:
            self._store = _immortal(self._renew())
            renewed = _alive(self._store)
        except Exception:  # noqa: BLE001 - said below
            renewed = False
        if len(self.stats.tampered) < 20:
            self.stats.tampered.append({"at": round(now, 3), "error": str(error).splitlines()[0][:200] if str(error)
                                        else type(error).__name__, "renewed": renewed})
        if not renewed:
            self.stats.lost, self.stats.lost_at = True, round(now, 3)
        self._log(f"ddp-doctor: the side-channel store dropped this launcher's connection at "
                  f"{time.strftime('%H:%M:%S', time.localtime(now))} (someone else wrote a value it refused to "
                  f"handle): {'connected afresh' if renewed else 'the ranks go unwatched from now on'}")

    def _next_seq(self) -> int:
        with self._seq_lock:
            self._seq = max(self._seq + 1, time.time_ns())
            return self._base + self._seq

    # -- the store's calls ---------------------------------------------------------------
    def set(self, key: str, value: str | bytes, deadline: float | None = None) -> None:
        payload = value.encode() if isinstance(value, str) else bytes(value)
        sealed = seal(self.secret, key, self._next_seq(), payload)
        self.stats.bytes_out += len(sealed)
        self._call(lambda s: s.set(key, sealed), deadline)

    def get(self, key: str, deadline: float | None = None) -> bytes:
        raw = bytes(self._call(lambda s: s.get(key), deadline))
        self.stats.bytes_in += len(raw)
        return self.verify(key, raw)

    def peek(self, key: str, deadline: float | None = None) -> bytes | None:
        """The verified value of ``key``, or None when there is none: one request that never waits for the
        key (``get`` waits until it exists).  (compare_set with an expected value no sealed value has.)"""
        raw = bytes(self._call(lambda s: s.compare_set(key, _ABSENT, _NEVER), deadline))
        if raw == _ABSENT:
            return None
        self.stats.bytes_in += len(raw)
        return self.verify(key, raw)

    def multi_get(self, keys: list[str], deadline: float | None = None) -> list[bytes | None]:
        """Verified values of keys that all exist, in one request (None for a value that does not verify);
        a store without ``multi_get`` (torch < 2.6) is asked key by key."""
        def fetch(s):
            if hasattr(s, "multi_get"):
                return s.multi_get(list(keys))
            return [s.compare_set(k, _ABSENT, _NEVER) for k in keys]
        raws = self._call(fetch, deadline)
        out: list[bytes | None] = []
        for k, raw in zip(keys, raws):
            raw = bytes(raw)
            self.stats.bytes_in += len(raw)
            try:
                out.append(None if raw == _ABSENT else self.verify(k, raw))
            except Rejected:
                out.append(None)
        return out

    def delete(self, key: str, deadline: float | None = None) -> None:
        self._call(lambda s: s.delete_key(key), deadline)

    def check(self, keys: list[str], deadline: float | None = None) -> bool:
        """True when every key holds a value that verifies (a forged ``ddpd/stop`` does not count)."""
        if not self._call(lambda s: s.check(list(keys)), deadline):
            return False
        for k in keys:
            try:
                self.get(k, deadline)
            except Rejected:
                return False
        return True

    def present(self, keys: list[str], deadline: float | None = None) -> bool:
        """True when every key holds a value, verified or not (one request: whether ``multi_get`` may ask)."""
        return bool(self._call(lambda s: s.check(list(keys)), deadline))

    def counter_key(self, key: str) -> str:
        """Where the counter ``key`` lives on the store: under a name only this job's secret gives (the plain
        name on an unauthenticated channel)."""
        return key if self.secret is None else f"{key}/{_mac(self.secret, key, 0, b'counter')[:24]}"

    def add(self, key: str, n: int, deadline: float | None = None) -> int:
        """Add ``n`` to the counter ``key`` (0: read it); Rejected when the counter holds what is not an
        integer (refused and counted, never added to: the store would drop this connection)."""
        where = self.counter_key(key)

        def bump(s):
            raw = bytes(s.compare_set(where, _ABSENT, _NEVER))
            if raw != _ABSENT and not _is_counter(raw):
                return raw
            return s.add(where, n)
        got = self._call(bump, deadline)
        if isinstance(got, (bytes, bytearray)):
            self._reject(key, bytes(got), "not a counter")
            raise Rejected("not a counter")
        return int(got)

    @property
    def port(self) -> int:
        return self._store.port

    # -- verification --------------------------------------------------------------------
    def verify(self, key: str, raw: bytes) -> bytes:
        """The payload of a value read from ``key``; Rejected (counted; logged once per key and reason) if bad."""
        try:
            seq, payload = unseal(self.secret, key, raw)
            if seq < self._last.get(key, 0):
                raise Rejected("replayed")
        except Rejected as e:
            self._reject(key, raw, str(e))
            raise
        self._last[key] = seq
        return payload

    def _reject(self, key: str, raw: bytes, reason: str) -> None:
        mark = (key, hashlib.sha256(raw).digest())
        if mark in self._seen_bad:
            return
        self._seen_bad.add(mark)
        self.stats.rejected[reason] = self.stats.rejected.get(reason, 0) + 1
        # by key too (the keys read are this job's: ranks, stacks, stop, node summaries); past a few
        # hundred keys the rest share one entry
        by_key = self.stats.rejected_by_key
        slot = key if key in by_key or len(by_key) < MAX_KEYS_COUNTED else OTHER_KEYS
        by_key.setdefault(slot, {})[reason] = by_key.get(slot, {}).get(reason, 0) + 1
        if key not in self.stats.rejected_keys and len(self.stats.rejected_keys) < 20:
            self.stats.rejected_keys.append(key)
        if (key, reason) not in self._logged and len(self._logged) < 20:
            self._logged.add((key, reason))
            self._log(f"ddp-doctor: dropped a side-channel value under {key!r} ({reason}): it was not written "
                      "by this job's ranks or launcher — someone else can reach the side-channel port")
