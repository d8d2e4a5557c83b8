"""A rank's posts to its watcher, end to end: the probe's publisher posts a base and per interval a delta
(``compact.StateEncoder``, signed by the side channel) to a real store, and the watcher reads back exactly the
state the probe built -- fields of every kind changing, the fingerprint ring moving past a base, the final
full state -- while a value someone else wrote under the rank's base key is never read."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest

from ddp_doctor import store as side
from ddp_doctor.evidence import (Activity, Collective, DataWait, GroupInit, LoaderState, RaisedError, RankState, Site,
                                 SiteCount, Timing)
from ddp_doctor.evidence.compact import StateDecoder, StateEncoder

S = Site("/u/train.py", 20, "main")
T = Site("/u/data.py", 7, "read")


def _state(k: int) -> RankState:
    """Rank 1 at its k-th post: most fields move now and then, some appear and go again."""
    ring = tuple(Collective("world", s, "all_reduce", ("4",), ("float32",), S if s % 3 else T, epoch=s // 40)
                 for s in range(max(0, 3 * k - 256), 3 * k))
    return RankState(
        rank=1, local_rank=1, host="h", pid=42, world_size=2, group=GroupInit(2, 1, S, "gloo", 3 * k),
        t=k * 0.25, epoch=k // 40, step=k, progress=4 * k, steps_by_epoch=(40,) * (k // 40), train_loader=0,
        step_times=tuple(0.1 + j / 1000 for j in range(min(k, 50))), cpu_s=k / 8,
        activity=Activity(k / 8, 4096 * k, 0.0, k % 5), pg_timeout_s=90.0, where=S if k % 4 else T,
        in_collective=ring[-1] if k % 2 and ring else None, last_collective=ring[-2] if len(ring) > 1 else None,
        in_data_wait=DataWait(0, 0.5) if k % 7 == 3 else None, seq={"world": 3 * k},
        fingerprints=ring, site_counts=(SiteCount("all_reduce", S, 2 * k), SiteCount("all_reduce", T, k))[:1 + k % 2],
        timing=Timing(k, k * 0.2, k * 0.1, 0.0, k * 0.05, k * 0.05), coll_count=3 * k, coll_time_s=k * 0.05,
        loaders=(LoaderState(site=T, len=40, num_workers=2, epochs=k // 40, batches=k),),
        exc=RaisedError("RuntimeError", "builtins", "boom", T) if k == 90 else None,
        perf={"loadavg": [1.0, 0.5, 0.25]} if k % 10 < 5 else {})


def test_every_field_of_a_state_survives_its_deltas_whichever_posts_the_agent_reads():
    enc, dec = StateEncoder(), StateDecoder()
    for k in range(1, 120):
        st = _state(k)
        base, delta = enc.encode(st, k * 0.25)
        if base is not None:
            dec.set_base(base)
        if k % 2 or base is not None:
            assert dec.decode(delta) == st, k
        if base is None:   # the changed fields only: never the whole state
            assert not {"rank", "host", "pid", "world_size", "pg_timeout_s"} & set(json.loads(delta.split(b"\n")[0])[1])


@pytest.fixture
def channel(monkeypatch):
    monkeypatch.setenv("DDP_DOCTOR_SECRET", "t" * 32)
    host, port = side.host_store()
    yield host, port
    host.close()


def test_the_probe_posts_deltas_that_the_watcher_reads_back_as_the_very_state_built(channel, tmp_path):
    import torch.distributed as dist

    from ddp_doctor.probe.publisher import Publisher
    from ddp_doctor.probe.recorder import Recorder
    from ddp_doctor.watcher import Watcher

    host, port = channel
    rec = Recorder()
    rec.rank, rec.world_size = 0, 1
    pub = Publisher(rec, f"127.0.0.1:{port}")
    built: list[RankState] = []
    plain_encode = pub.encoder.encode

    def encode(st, now, extra=None):
        built.append(st)
        return plain_encode(st, now, extra)

    pub.encoder.encode = encode
    watcher = Watcher(host, world_size=1, hang_timeout=None, run_dir=str(tmp_path))
    key = side.rank_key(0)
    bases = 0
    for k in range(1, 140):
        for _ in range(3):  # 3 collectives a post: the ring of 256 moves past a base
            rec.coll_enter("world", "all_reduce", ("4",), ("float32",), ("/u/train.py", 20 + k % 2, "main"))
        rec.cur, rec.progress, rec.steps = None, rec.progress + 4, k
        pub.publish()
        raw = host.peek(key)
        assert raw is not None and raw[:1] == b"["      # a delta, not the state's JSON
        bases = max(bases, len(watcher.decoders.get(key).ring) if key in watcher.decoders else 0)
        watcher.read_states()
        got = watcher.views[0].state
        assert got == built[-1], k
    assert pub.encoder.base_id % (1 << 20) >= 2 and bases == 256
    # someone else's value under the base key (and a delta naming it) is refused, never read
    evil = dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False, timeout=timedelta(seconds=10))
    forged = json.dumps([7, {**json.loads(host.peek(key).split(b"\n")[0])[1], "schema": 4, "rank": 0, "step": 99}])
    evil.set(side.state_base_key(key), forged)
    evil.set(key, b"[7,{}]")
    watcher.read_states()
    assert watcher.views[0].state.step == 139 and host.stats.rejected_by_key.get(key)
    evil.delete_key(key)          # (a stranger's deletion: never a wait for the key to come back)
    watcher.read_states()
    assert watcher.views[0].state.step == 139
    # the final post: the full state, read as one
    rec.done, rec.exit_code = True, 0
    pub.publish(final=True)
    watcher.read_states()
    final = watcher.views[0].state
    assert final.done and final.exit_code == 0 and final.timeline is not None and len(final.fingerprints) == 256
    pub.store.close()


def test_the_fingerprints_issued_after_a_base_that_held_none_reach_the_agent():
    """A rank's first post comes before its first collective (a base with an empty ring): every fingerprint it
    issues afterwards is in its next delta (they were left out until the next base, 30 s later, so the agent
    saw no collective of that rank: an FSDP2 rank-0 call gloo aborted went unseen, and undiagnosed)."""
    enc, dec = StateEncoder(), StateDecoder()
    base, delta = enc.encode(RankState(rank=0), 0.0)
    assert base is not None and dec.set_base(base) is not None and dec.decode(delta).fingerprints == ()
    calls = tuple(Collective("world", s, "all_reduce", ("4",), ("float32",)) for s in (1, 2))
    base, delta = enc.encode(RankState(rank=0, fingerprints=calls[:1]), 0.2)
    assert base is None and [c.seq for c in dec.decode(delta).fingerprints] == [1]
    base, delta = enc.encode(RankState(rank=0, fingerprints=calls), 0.4)
    assert base is None and [c.seq for c in dec.decode(delta).fingerprints] == [1, 2]
