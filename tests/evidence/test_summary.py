"""Node summaries (hierarchical watching): JSON round trips, and the compact delta encoding decodes to the very
summaries that were encoded, while a delta carries only what changed."""
from __future__ import annotations

import json

from ddp_doctor.evidence import (Collective, Control, Deadline, Digests, Finished, JobEvidence, NodeDetail, NodeLoss,
                                 NodeSummary, Outside, Pull, RankState, Site, Verdict, Waiting)
from ddp_doctor.evidence.compact import SETTLED, Decoder, Encoder, pack_codes, unpack_codes
from ddp_doctor.evidence.summary import rank_runs, ranges, unranges

S = Site("/u/train.py", 20, "main")
T = Site("/u/data.py", 7, "read")


def _summary(version: int = 1, **kw) -> NodeSummary:
    c = Collective("world", 7, "all_reduce", site=S, waiting_s=3.0, blocking=True)
    base = dict(
        node=2, version=version, t=100.0 + version, host="h2", attempt=0, world_size=16, ranks=(8, 9, 10, 11),
        live=(8, 9, 11), failed=(10,), finished=(Finished({"world": 7, "pg:8,9": 2}, (12,)),),
        waiting=(Waiting(c, (8, 9)),), outside=(Outside(11, T, 4.0),), busy=(11,), progress_age_s=4.25,
        active_age_s=1.5, first_t=3.0, progress=120,
        deadline=Deadline(8, Collective("world", 7, "all_reduce", site=S, waiting_s=1790.0), 1800.0),
        step_p90_s=0.2, step_n=150,
        desync=Verdict("desync", kind="op", group="world", seq=7,
                       calls={8: Collective("world", 7, "all_reduce", site=S), 9: Collective("world", 7, "barrier")}),
        digests=(Digests("world", 5, (((1 << 40) | 3,), (7,), ())), Digests("pg:8,9", 0, ((5, 6),))),)
    base.update(kw)
    return NodeSummary(**base)


def test_records_round_trip_through_json():
    s = _summary()
    assert NodeSummary.from_json(json.loads(json.dumps(s.to_json()))) == s
    ctl = Control(3, "hang", {1: Pull(4, True), 7: Pull(5)})
    assert Control.from_json(json.loads(json.dumps(ctl.to_json()))) == ctl
    d = NodeDetail(1, 4, "h", (RankState(rank=8, host="h", step=3, stack=(S,)),), final=True, t0=1.7e9)
    assert NodeDetail.from_json(json.loads(json.dumps(d.to_json()))) == d
    ev = JobEvidence(16, {8: RankState(rank=8)}, lost_nodes=(NodeLoss(1, "h1", (4, 5), 3.5),))
    assert JobEvidence.from_json(json.loads(json.dumps(ev.to_json()))) == ev


def test_rank_runs_and_packed_codes():
    assert ranges([3, 1, 2, 7, 9, 8]) == [[1, 3], [7, 9]]
    assert rank_runs([3, 1, 2, 7, 9, 8, 12]) == "1-3, 7-9, 12" and rank_runs([]) == ""
    assert unranges(ranges(range(16, 24))) == tuple(range(16, 24))
    codes = ((1 << 63) | 5, (), (42,))
    codes = ((codes[0],), (), (42,))
    assert isinstance(pack_codes(codes), str) and unpack_codes(pack_codes(codes)) == codes
    both = ((1, 2), (3,))
    assert unpack_codes(pack_codes(both)) == both


def test_deltas_decode_to_the_summaries_encoded():
    enc, dec = Encoder(), Decoder()
    base_raw = None
    seq = [_summary(1), _summary(2, progress=130), _summary(3, progress=140, waiting=()),
           _summary(4, progress=140, outside=(Outside(11, S, 5.0), Outside(8, None, 0.0))),
           _summary(5), _summary(6, desync=None, digests=(), failed=())]
    sizes = []
    for i, s in enumerate(seq):
        base, delta = enc.encode(s, now=float(i))
        if base is not None:
            base_raw = base
            dec.set_base(base)
        _, flat = Decoder.base_of(delta)
        assert dec.decode(flat) == s
        sizes.append(len(delta))
    assert base_raw is not None and max(sizes[1:]) < len(base_raw), (sizes, len(base_raw))
    assert len(enc.values(seq[0])) == len(json.loads(base_raw)) - 1


def test_a_change_that_settles_moves_into_a_new_base():
    enc = Encoder()
    bases = []
    for v in range(1, 2 * SETTLED + 5):
        s = _summary(v, world_size=32 if v > 3 else 16)   # changed once at v=4, then constant
        base, _ = enc.encode(s, now=float(v))
        bases.append(base is not None)
    assert bases[0] and sum(bases) == 2, bases          # the first base, and one after the change settled
    assert bases.index(True, 1) == 3 + SETTLED - 1


def test_a_delta_for_a_base_the_root_does_not_hold_is_not_misread():
    enc, dec = Encoder(), Decoder()
    base, delta = enc.encode(_summary(1), now=0.0)
    _, flat = Decoder.base_of(delta)
    assert dec.decode(flat) is None          # no base yet
    dec.set_base(base)
    assert dec.decode(flat) == _summary(1)
    enc2 = Encoder()
    enc2.base_id = 7
    _, other = enc2.encode(_summary(2), now=0.0)
    assert dec.decode(Decoder.base_of(other)[1]) is None   # another base id


def test_a_ranks_compact_posts_rebuild_its_state_even_when_the_agent_misses_some():
    """compact.StateEncoder / StateDecoder: a base, then deltas of the changed fields and the fingerprints
    issued since the base; the agent reads only every third post and still holds the rank's exact state --
    also when the fields that share the sites table change (a new call site), a field leaves the wire (the
    default process group, a perf reading) and the probe adds fields of its own."""
    from ddp_doctor.evidence import Activity, Collective, GroupInit, Site, SiteCount
    from ddp_doctor.evidence.compact import StateDecoder, StateEncoder

    site = Site("/u/t.py", 9, "step")
    ring: list = []
    enc, dec = StateEncoder(), StateDecoder()
    for k in range(1, 700):
        ring.append(Collective("world", k - 1, "all_reduce", ("4",), ("float32",), site, epoch=k // 100))
        counts = tuple(SiteCount("all_reduce", Site("/u/t.py", 9 + j, "step"), k) for j in range(1 + k // 50 % 3))
        st = RankState(rank=3, step=k, progress=2 * k, cpu_s=k / 10, activity=Activity(k / 10, 0, 0.0, k),
                       seq={"world": k}, fingerprints=tuple(ring[-256:]), where=site if k % 7 else None,
                       site_counts=counts[::-1] if k % 5 else counts,
                       group=GroupInit(4, 3) if k % 11 < 6 else None, perf={"loadavg": [k % 3]} if k % 4 else {},
                       coll_count=k, coll_time_s=k / 100)
        base, delta = enc.encode(st, k * 0.2, {"side_channel": {"dropped": k // 9}})
        if base is not None:
            assert dec.set_base(base) == enc.base_id
        if k % 3 == 0 or base is not None:
            got = dec.decode(delta)
            assert got == st, k
            assert len(delta) < 600 + 90 * 256
    assert enc.base_id % (1 << 20) >= 3   # (the ring moved on: new bases now and then)


def test_a_restarted_ranks_first_post_is_never_read_against_its_predecessors_base():
    from ddp_doctor.evidence.compact import StateDecoder, StateEncoder

    old, new, dec = StateEncoder(), StateEncoder(), StateDecoder()
    base, _ = old.encode(RankState(rank=1, step=9), 1.0)
    dec.set_base(base)
    _, delta = new.encode(RankState(rank=1, step=0, attempt=1), 1.0)
    assert dec.decode(delta) is None   # (the agent fetches the new base first)
    assert StateDecoder().set_base(b'[1,{"rank":1}]') is None   # not a state of this schema: never misread


def test_a_pull_names_its_ranks_on_the_wire():
    ctl = Control(3, None, {2: Pull(4, True, (16, 17, 18, 40))})
    assert Control.from_json(ctl.to_json()) == ctl
    assert Control.from_json({"version": 1, "pulls": {"2": [4, 1]}}).pulls[2] == Pull(4, True)
