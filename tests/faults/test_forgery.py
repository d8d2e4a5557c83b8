"""A second client on the job's side-channel store forges a rank's state: the job is not stopped, the forgery
is dropped, counted and logged (values are signed with a per-job secret the wire never carries)."""
from __future__ import annotations

import json
import threading
import time
from datetime import timedelta

import psutil
import pytest

from conftest import SCRIPTS, alive, env, poll, ranks_of, start_run

pytestmark = pytest.mark.scenario  # real multi-rank jobs: the full tier (make test), not test-fast


def _store_of(ranks: list[psutil.Process]) -> str | None:
    for r in ranks:
        try:
            addr = r.environ().get("DDP_DOCTOR_STORE")
        except psutil.Error:
            continue
        if addr:
            return addr
    return None


def _fields(signed: bytes) -> dict:
    """The state fields of a signed post: a full state, a base's or a delta's first line (compact.StateEncoder)."""
    v = json.loads(signed.split(b"|", 3)[3].split(b"\n")[0])
    return v if isinstance(v, dict) else v[1]


class _Output:
    """The run's output as it comes (a reader thread), so the test can wait for a line."""

    def __init__(self, stream) -> None:
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(stream), daemon=True)
        self.reader.start()

    def text(self) -> str:
        return "".join(self.lines)


def test_forged_rank_state_does_not_stop_the_job(tmp_path, cleanup):
    import torch.distributed as dist

    report = tmp_path / "r.json"
    run = start_run(["--quiet", "--no-lint", "--report", str(report), "--nproc-per-node", "2",
                     str(SCRIPTS / "short_train.py")], env=env(STEPS="200"))
    cleanup.append(psutil.Process(run.pid))
    log = _Output(run.stdout)
    ranks = poll(lambda: len(ranks_of(run.pid)) == 2 and ranks_of(run.pid), 90)
    assert ranks, run.poll()
    cleanup.extend(ranks)
    addr = poll(lambda: _store_of(ranks), 10)
    assert addr, "no DDP_DOCTOR_STORE in the ranks' environment"
    host, _, port = addr.rpartition(":")
    # the attacker: any process that reaches the port
    evil = dist.TCPStore(host, int(port), is_master=False, wait_for_workers=False, timeout=timedelta(seconds=20))
    assert poll(lambda: evil.check(["ddpd/rank/1", "ddpd/rank/1/base"])
                and _fields(evil.get("ddpd/rank/1")).get("step"), 60)
    old = evil.get("ddpd/rank/1")  # a genuine, signed value, replayed later
    state = _fields(evil.get("ddpd/rank/1/base"))   # (a full state is read too: the forgery posts one)
    forged = dict(state, exc={"type": "RuntimeError", "module": "builtins", "message": "forged by a third party",
                              "location": {"path": "/etc/passwd", "line": 1, "function": "x"}, "traceback": [],
                              "in_collective": False, "collective": None, "t": 1.0})
    forged_json = json.dumps(forged).encode()
    # each kind of forgery in a phase of its own, re-posted faster than the rank's own posts (every 20 ms), until
    # the watcher logs that it dropped that kind (it logs each kind once per key); the replay is re-posted more
    # slowly (every 0.3 s), so the watcher also reads the rank's own newer posts in between: a replay is only
    # recognisable as one once the watcher has read a newer genuine value
    phases = (("unsigned", 0.02, lambda: (evil.set("ddpd/rank/1", forged_json),
                                          evil.set("ddpd/exit/0/1", json.dumps({"exit_code": 1, "signal": "SIGKILL"})))),
              ("bad signature", 0.02, lambda: (evil.set("ddpd/rank/1", b"ddpd1|99999999999999999999999|" + b"0" * 64
                                                        + b"|" + forged_json),
                                               evil.set("ddpd/stop", json.dumps({"reason": "hang"})))),
              ("replayed", 0.3, lambda: evil.set("ddpd/rank/1", old)))
    for reason, pace, forge in phases:
        line = f"dropped a side-channel value under 'ddpd/rank/1' ({reason})"
        end = time.monotonic() + 60
        while line not in log.text() and time.monotonic() < end and run.poll() is None:
            forge()
            time.sleep(pace)  # (the pace of the attacker's posts, not a wait for anything)
        assert line in log.text(), (reason, run.poll(), log.text()[-3000:])
    evil.set("ddpd/stop", b"ddpd1|1|" + b"0" * 64 + b"|{}")  # badly signed: the ranks read it as they end
    run.wait(timeout=120)
    log.reader.join(timeout=30)
    out = log.text()
    assert run.returncode == 0, out[-3000:]
    assert "TRAINING DONE" in out
    rep = json.loads(report.read_text())
    assert rep["verdict"] == "ok" and not [f for f in rep["findings"] if f["severity"] == "error"], rep["findings"]
    side = rep["side_channel"]
    assert side["authenticated"] is True
    assert side["rejected"].get("unsigned", 0) >= 1, side
    assert side["rejected"].get("bad signature", 0) >= 1, side
    assert side["rejected"].get("replayed", 0) >= 1, side
    # (a forged exit status under ddpd/exit/... is not even read: a rank's exit is seen by its own node's
    # launcher, never taken from the store)
    assert "ddpd/rank/1" in side["rejected_keys"], side
    # every refused value is counted by key, the forged stop included (the ranks read it, and report it)
    by_key = side["rejected_by_key"]
    assert {"unsigned", "bad signature", "replayed"} <= set(by_key["ddpd/rank/1"]), by_key
    assert by_key["ddpd/stop"].get("bad signature", 0) >= 1, by_key
    assert sum(side["rejected"].values()) == sum(n for by in by_key.values() for n in by.values())
    assert "dropped a side-channel value under 'ddpd/rank/1'" in out
    assert not [p for p in ranks if alive(p)]
