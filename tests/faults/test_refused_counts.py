"""Every side-channel value a reader refuses is counted by key in the report: the launcher's own refusals
(forged rank states) and the ranks' (a forged ``ddpd/stop`` is read by the ranks only)."""
from __future__ import annotations

import json
import types

from ddp_doctor import store as side
from ddp_doctor.channel import SideChannel, seal
from ddp_doctor.evidence import JobEvidence, RankState, Refused
from ddp_doctor.session.assemble import side_channel_section


def test_a_forged_stop_is_refused_and_counted_by_key(monkeypatch):
    monkeypatch.setenv("DDP_DOCTOR_SECRET", "a" * 64)
    host, port = side.host_store(0)
    reader = SideChannel(side.tcp_client("127.0.0.1", port, 10), secret=b"a" * 64, log=lambda m: None)
    evil = side.tcp_client("127.0.0.1", port, 10)
    evil.set(side.STOP, json.dumps({"reason": "hang"}))                       # unsigned
    assert not reader.check([side.STOP])
    evil.set(side.STOP, seal(b"b" * 64, side.STOP, 1, b'{"reason": "hang"}'))  # another key's signature
    assert not reader.check([side.STOP])
    assert not reader.check([side.STOP])  # the same bad value again: counted once
    assert reader.stats.rejected_by_key == {side.STOP: {"unsigned": 1, "bad signature": 1}}
    host.set(side.STOP, json.dumps({"reason": "hang"}))                       # the watcher's own, signed
    assert reader.check([side.STOP])


def test_the_report_counts_the_ranks_refusals_by_key():
    launcher = SideChannel(types.SimpleNamespace(), secret=b"k", log=lambda m: None)
    launcher.stats.rejected.update({"unsigned": 2})
    launcher.stats.rejected_by_key.update({"ddpd/rank/1": {"unsigned": 2}})
    stop = side.STOP
    ranks = {0: RankState(0, refused=(Refused(stop, "bad signature", 1), Refused(stop, "unsigned", 1))),
             1: RankState(1, refused=(Refused(stop, "bad signature", 1),))}
    job = types.SimpleNamespace(store=launcher, local=None, watcher=None, nnodes=1,
                                args=types.SimpleNamespace(nproc_per_node="2", node_rank=0))
    out = side_channel_section(job, JobEvidence(2, ranks))
    assert out["rejected_by_key"] == {"ddpd/rank/1": {"unsigned": 2}, stop: {"bad signature": 1, "unsigned": 1}}
    assert out["rejected"] == {"unsigned": 3, "bad signature": 1}
    assert out["rejected_keys"] == ["ddpd/rank/1", stop]


def test_the_terminal_names_each_key():
    from ddp_doctor.report.terminal import print_report
    import io

    buf = io.StringIO()
    print_report({"schema": "ddp-doctor/report/v1", "verdict": "ok", "exit_code": 0, "world_size": 2,
                  "findings": [], "ranks": [], "side_channel": {
                      "authenticated": True, "rejected": {"unsigned": 3, "bad signature": 1},
                      "rejected_by_key": {"ddpd/rank/1": {"unsigned": 2}, "ddpd/stop": {"bad signature": 1,
                                                                                      "unsigned": 1}}}},
                 file=buf, color=False)
    text = " ".join(buf.getvalue().split())
    assert "under ddpd/rank/1: 2 unsigned; under ddpd/stop: 1 bad signature, 1 unsigned" in text, text
