"""Read a saved report to render it: in memory bounded by what is shown, or refused in one line.

A report of a large job is large (a rank keeps its last 2,000 timeline events: 1,400 ranks make 2.8 M of
them, over 200 MB), and ``json.load`` turns every 70-byte event into a ~400-byte dict.  To render, only
each rank's last ``_view.timeline_cap`` events are kept while parsing (``lean``); a file that would still
take more memory than :data:`MEMORY_BUDGET` to read, or is larger than :data:`MAX_BYTES`, is refused with
a clear line rather than rendered slowly into swap.
"""
from __future__ import annotations

import collections
import json
import os
from typing import Any

from ddp_doctor.report._view import timeline_cap

MAX_BYTES = 512 << 20        # a report file this large is not read at all
MEMORY_BUDGET = 768 << 20    # resident memory reading may reach before it gives up
_CHECK_EVERY = 1 << 15       # objects parsed between two looks at the resident memory
_TIMELINE_KEYS = frozenset({"t", "kind", "dur", "label"})


class TooLarge(Exception):
    """The report cannot be read within the limits; the message says why, in one line."""


def _rss() -> int:
    try:
        import psutil

        return psutil.Process().memory_info().rss
    except Exception:  # no psutil (a broken install): no guard, the size limit still holds
        return 0


class _Hook:
    """``json`` object_hook: watches memory every few thousand objects; when ``lean``, holds back timeline
    events and gives each timeline only its last ``cap`` (events of one rank are parsed, in order, just
    before the rank that holds them)."""

    def __init__(self, path: str, cap: int | None) -> None:
        self.path = path
        self.cap = cap
        self.n = 0
        self.events: collections.deque = collections.deque(maxlen=cap or 0)

    def __call__(self, d: dict[str, Any]) -> Any:
        self.n += 1
        if self.n % _CHECK_EVERY == 0 and _rss() > MEMORY_BUDGET:
            raise TooLarge(f"{self.path} needs more than {MEMORY_BUDGET >> 20} MiB of memory to read "
                           f"({self.n:,} objects so far): too large to render; its JSON is intact")
        if self.cap is None:
            return d
        if d.keys() <= _TIMELINE_KEYS and type(d.get("kind")) is str and type(d.get("t")) in (float, int):
            self.events.append(d)
            return None  # a placeholder in the list until its rank swaps in the last events
        tl = d.get("timeline")
        if isinstance(tl, list):
            d["timeline"] = [x for x in tl if x is not None] + list(self.events)
            self.events.clear()
        return d


def load(path: str, lean: bool = False, timelines: bool = True) -> Any:
    """The parsed file (``lean``: timelines cut as the HTML page shows them, or dropped when no
    ``timelines`` are drawn); TooLarge, OSError, ValueError (not JSON) and RecursionError are the
    caller's to say in one line."""
    size = os.path.getsize(path)
    if size > MAX_BYTES:
        raise TooLarge(f"{path} is {size / (1 << 20):.0f} MiB, more than the {MAX_BYTES >> 20} MiB ddp-doctor "
                       "report reads; its JSON is intact")
    with open(path, encoding="utf-8") as fh:
        text = fh.read()
    cap = (timeline_cap(text.count('"timeline"')) if timelines else 0) if lean else None
    return json.loads(text, object_hook=_Hook(path, cap))
