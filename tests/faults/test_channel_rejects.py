"""The side channel's verification on its own (no job): each bad value is counted once, and each kind of
rejection is logged once per key, so the forgery test can wait for the line of the kind it posted."""
from __future__ import annotations

import pytest

from ddp_doctor.channel import Rejected, SideChannel, seal


def test_each_kind_of_rejection_is_logged_once_per_key():
    lines: list[str] = []
    ch = SideChannel(secret=b"k" * 32, log=lines.append)
    key = "ddpd/rank/1"
    new, old = seal(ch.secret, key, 5, b"{}"), seal(ch.secret, key, 3, b"{}")
    assert ch.verify(key, new) == b"{}"
    bad = {"unsigned": b"{}", "bad signature": seal(b"other" * 8, key, 9, b"{}"), "replayed": old}
    for reason, raw in bad.items():
        for _ in range(3):  # the same value read again: counted and logged once
            with pytest.raises(Rejected, match=reason):
                ch.verify(key, raw)
    with pytest.raises(Rejected, match="unsigned"):
        ch.verify(key, b"another unsigned value")
    assert ch.stats.rejected == {"unsigned": 2, "bad signature": 1, "replayed": 1}
    assert ch.stats.rejected_keys == [key]
    assert [ln.split("(")[1].split(")")[0] for ln in lines] == ["unsigned", "bad signature", "replayed"]
    assert all(f"under {key!r}" in ln for ln in lines)
