"""Counters on the side channel poisoned by a stranger (issue 39): torch's TCPStore drops the connection of a
client whose ``add()`` meets text, which left the watcher blind for the rest of the job (the report said both
ranks exited at step ~90 of 700, the side channel never lost).  Counters now live under names derived from the
job's secret, every ``add`` reads the counter first and refuses text (counted), and a host whose own server drops
its connection connects afresh and says so; one it cannot renew is lost from then, and no verdict rests on it."""
from __future__ import annotations

import io
import json
import time
from datetime import timedelta

import psutil
import pytest
from rich.console import Console

from conftest import SCRIPTS, alive, env, poll, ranks_of, start_run
from ddp_doctor import store as side
from ddp_doctor.channel import ChannelDown, Rejected, SideChannel
from ddp_doctor.report import terminal

PLAIN_COUNTERS = (side.REQ, side.NEWS, side.ack_key(0, 0), side.ack_key(0, 1), side.NODES, side.REPORT_READ)


def _stranger(port: int):
    return side.tcp_client("127.0.0.1", port, 10.0)


def test_counters_live_under_names_only_the_secret_gives():
    signed, other = SideChannel(secret=b"a" * 32), SideChannel(secret=b"b" * 32)
    for key in PLAIN_COUNTERS:
        assert signed.counter_key(key) != key and signed.counter_key(key).startswith(key + "/")
        assert signed.counter_key(key) != other.counter_key(key)
    assert SideChannel().counter_key(side.NEWS) == side.NEWS  # unauthenticated: nothing to derive a name from


@pytest.mark.parametrize("secret", [b"s" * 32, None], ids=["signed", "unauthenticated"])
def test_a_poisoned_counter_is_refused_and_the_channel_keeps_working(secret):
    lines: list[str] = []
    ch, port = side.host_store(0, secret=secret)
    ch._log = lines.append
    assert ch.add(side.NEWS, 1) == 1
    evil = _stranger(port)
    for poison in ("poison", "", "9" * 30):  # (torch's stoll fails on each: text, nothing, past int64)
        _written(evil, ch.counter_key(side.NEWS), poison)
        for _ in range(3):
            with pytest.raises(Rejected, match="not a counter"):
                ch.add(side.NEWS, 0)
    assert ch.stats.rejected_by_key == {side.NEWS: {"not a counter": 3}}
    assert len([ln for ln in lines if "not a counter" in ln]) == 1
    _written(evil, ch.counter_key(side.NEWS), "41")
    assert ch.add(side.NEWS, 1) == 42
    ch.set(side.rank_key(0), "{}")  # the connection is intact: no call was made that the server drops
    assert ch.peek(side.rank_key(0)) == b"{}" and not ch.stats.tampered and not ch.lost


def _written(client, key: str, value: str) -> None:
    """Set, and read back on the same connection: a store client's set is not answered, so a read from another
    connection could otherwise reach the server first."""
    client.set(key, value)
    client.get(key)


def test_a_host_whose_server_drops_its_connection_connects_afresh_and_records_it():
    ch, port = side.host_store(0, secret=b"s" * 32)
    ch._log = lambda m: None
    _written(_stranger(port), "ddpd/x", "text")
    before = time.time()
    with pytest.raises(Exception):
        ch._call(lambda s: s.add("ddpd/x", 1))  # what an add racing the stranger's write meets: dropped
    ch.set(side.rank_key(1), "{}")
    assert ch.peek(side.rank_key(1)) == b"{}"
    (t,) = ch.stats.tampered
    assert t["renewed"] is True and t["at"] >= before - 1 and ch.stats.lost_at is None


def test_a_host_that_cannot_renew_is_lost_from_then_and_says_so():
    lines: list[str] = []
    ch, port = side.host_store(0, secret=b"s" * 32)
    ch._log = lines.append
    ch._renew = lambda: (_ for _ in ()).throw(ConnectionRefusedError("no"))
    _written(_stranger(port), "ddpd/x", "text")
    with pytest.raises(Exception):
        ch._call(lambda s: s.add("ddpd/x", 1))
    assert ch.lost and ch.stats.lost_at is not None and ch.stats.tampered[0]["renewed"] is False
    with pytest.raises(ChannelDown):
        ch.peek(side.rank_key(0))
    assert any("unwatched from now on" in ln for ln in lines)
    # the report says from when, and that no verdict rests on it
    report = {"side_channel": dict(ch.stats.to_dict(), unwatched_ranks=[0, 1], unwatched_nodes=[])}
    buf = io.StringIO()
    terminal._side_channel(Console(file=buf, width=100, color_system=None), report)
    text = " ".join(buf.getvalue().split())
    clock = time.strftime("%H:%M:%S", time.localtime(ch.stats.lost_at))
    assert f"ranks 0, 1 unwatched from {clock}: the side channel was tampered with" in text
    assert "no verdict rests on it" in text and "never reached" not in text


def test_a_watcher_whose_channel_is_lost_decides_nothing():
    from ddp_doctor.watcher import Watcher

    ch, _ = side.host_store(0, secret=b"s" * 32)
    ch.stats.lost, ch.stats.lost_at = True, time.time()
    w = Watcher(ch, world_size=2, hang_timeout=1.0, run_dir="/nonexistent")
    assert w.poll_once() is None


def _secret_and_store(ranks: list[psutil.Process]) -> tuple[str, str] | None:
    for r in ranks:
        try:
            e = r.environ()
        except psutil.Error:
            continue
        if e.get("DDP_DOCTOR_STORE") and e.get("DDP_DOCTOR_SECRET"):
            return e["DDP_DOCTOR_SECRET"], e["DDP_DOCTOR_STORE"]
    return None


@pytest.mark.scenario
def test_a_job_whose_counters_are_poisoned_is_watched_to_its_end(tmp_path, cleanup):
    """A real 2-rank job; the stranger poisons the counters' plain names (what anyone on the machine can
    guess), then -- as one who knows the secret or on an unauthenticated channel would -- their real names.
    The job ends well, watched to its last step, and the refusals are counted by key."""
    import torch.distributed as dist

    steps = 60
    report = tmp_path / "r.json"
    run = start_run(["--no-lint", "--report", str(report), "--nproc-per-node", "2",
                     str(SCRIPTS / "short_train.py")], env=env(STEPS=str(steps)))
    cleanup.append(psutil.Process(run.pid))
    ranks = poll(lambda: len(ranks_of(run.pid)) == 2 and ranks_of(run.pid), 90)
    assert ranks, run.poll()
    cleanup.extend(ranks)
    found = poll(lambda: _secret_and_store(ranks), 10)
    assert found, "no DDP_DOCTOR_STORE / DDP_DOCTOR_SECRET in the ranks' environment"
    secret, addr = found
    host, _, port = addr.rpartition(":")
    evil = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=20))
    assert poll(lambda: evil.check([side.rank_key(1)]), 60)
    for key in PLAIN_COUNTERS:
        evil.set(key, "poison")
    real = SideChannel(secret=secret.encode())
    for key in PLAIN_COUNTERS:
        evil.set(real.counter_key(key), "poison")
    out, _ = run.communicate(timeout=240)
    assert run.returncode == 0, out[-3000:]
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "ok", rep["findings"]
    assert [(r["rank"], r["state"], r["step"]) for r in rep["ranks"]] == [(0, "finished", steps), (1, "finished", steps)]
    side_channel = rep["side_channel"]
    assert not side_channel["lost"] and side_channel["lost_at"] is None and not side_channel["unwatched_ranks"]
    by_key = side_channel["rejected_by_key"]
    assert by_key[side.NEWS] == {"not a counter": 1} and by_key[side.REQ] == {"not a counter": 1}, by_key
    assert "dropped a side-channel value under 'ddpd/req' (not a counter)" in out
    assert not [p for p in ranks if alive(p)]


def test_a_watcher_whose_channel_is_lost_reads_no_desync_from_stale_states(monkeypatch):
    from ddp_doctor.diagnose import live
    from ddp_doctor.watcher import Watcher

    ch, _ = side.host_store(0, secret=b"s" * 32)
    w = Watcher(ch, world_size=2, hang_timeout=None, run_dir="/nonexistent")
    asked = []
    monkeypatch.setattr(live, "find_desync", lambda views, ws: asked.append(ws))
    w.settle({})
    assert asked == [2]  # (a watched job: the final states are read for a desync)
    ch.stats.lost, ch.stats.lost_at = True, time.time()
    w.settle({})
    assert asked == [2]
