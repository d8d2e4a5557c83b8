"""Report text is data, never terminal commands: strip control sequences; refuse absurdly nested input.

A report's strings come from the job (exception messages, file names, a rank's own output) or from a
JSON file anyone may hand to ``ddp-doctor report``: an ESC sequence in them could rewrite the screen,
set the window title or hide lines.  Every string is cleaned before the terminal sees it.
"""
from __future__ import annotations

import re
from typing import Any

MAX_DEPTH = 64  # a real report nests about 8 deep
# the most of one string a renderer shows (a real finding's message is under 2,000 characters); the JSON
# report keeps every character, the screen and the HTML page say how many they left out
MAX_DISPLAY_CHARS = 8000

# OSC (ESC ] ... BEL | ESC \), CSI (ESC [ params final), other two-byte ESC sequences, and their C1 forms
_SEQ = re.compile(r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?|\x9d[^\x07\x9c]*[\x07\x9c]?"
                  r"|\x1b\[[0-?]*[ -/]*[@-~]|\x9b[0-?]*[ -/]*[@-~]|\x1b[@-_]?")
_CTRL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")  # C0 (but \t, \n), DEL, C1


def clean_text(s: str) -> str:
    """``s`` without terminal control sequences or control characters (tabs and newlines kept)."""
    if not isinstance(s, str) or (s.isascii() and s.isprintable()):  # the common case, at C speed
        return s
    return _CTRL.sub("", _SEQ.sub("", s))


def shorten(s: str, max_chars: int = MAX_DISPLAY_CHARS) -> str:
    """``s`` cut to ``max_chars`` for display, saying how much is left out."""
    if len(s) <= max_chars:
        return s
    return s[:max_chars] + f" … [{len(s) - max_chars} more characters in the JSON report]"


def clean(obj: Any, max_chars: int | None = None) -> Any:
    """A copy of a JSON-like value with every string (keys too) cleaned, and cut to ``max_chars`` when given
    (cut first: cleaning and rendering then cost at most that much per string); iterative, any depth."""
    if max_chars is None:
        return _walk(obj, clean_text)

    def fix(s: str) -> str:
        return clean_text(s if len(s) <= max_chars else shorten(s, max_chars))
    return _walk(obj, fix)


def _walk(obj: Any, fix) -> Any:
    if isinstance(obj, str):
        return fix(obj)
    if not isinstance(obj, (dict, list, tuple)):
        return obj
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(obj, root, 0)]
    while stack:
        src, parent, key = stack.pop()
        if isinstance(src, dict):
            dst: Any = {}
            for k, v in src.items():
                stack.append((v, dst, fix(k) if isinstance(k, str) else k))
        elif isinstance(src, (list, tuple)):
            dst = [None] * len(src)
            for i, v in enumerate(src):
                stack.append((v, dst, i))
        else:
            dst = fix(src) if isinstance(src, str) else src
        parent[key] = dst
    return root[0]


def depth(obj: Any) -> int:
    """Nesting depth of a JSON-like value (iterative: no RecursionError on hostile input)."""
    best = 0
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if isinstance(o, dict):
            best = max(best, d)
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            best = max(best, d)
            stack.extend((v, d + 1) for v in o)
    return best
