"""Text that is not text: file names and messages holding bytes that are not valid UTF-8.

Python hands such bytes over as lone surrogates (``os.fsdecode(b"train_\\xff.py") == "train_\\udcff.py"``).
``json.dumps`` writes them as ``\\udcff`` escapes that strict JSON parsers (I-JSON, RFC 7493) refuse, and an
encoder with ``errors="replace"`` shows ``?``.  :func:`strict` is the one boundary every report passes on its way
out (the JSON files, ``--format json``, lint's JSON and SARIF, the terminal and the HTML page): each lone
surrogate becomes a readable escape -- ``\\xff`` for a byte of a file name, ``\\ud83d`` for any other -- and, for
files, the exact bytes stay beside it as base64 (``location.path_b64``: ``base64.b64decode`` then open that).
Stdlib only: the linter shares it.
"""
from __future__ import annotations

import base64
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def is_strict(s: str) -> bool:
    """Does ``s`` encode as UTF-8 (no lone surrogate)?"""
    return s.isascii() or _SURROGATE.search(s) is None


def readable(s: str) -> str:
    """``s`` with each lone surrogate spelled out: a byte Python could not decode (U+DC80..U+DCFF,
    ``surrogateescape``) as ``\\xNN``, any other as ``\\uNNNN``; valid text unchanged."""
    if is_strict(s):
        return s
    return _SURROGATE.sub(lambda m: (f"\\x{ord(m[0]) - 0xDC00:02x}" if 0xDC80 <= ord(m[0]) <= 0xDCFF
                                     else f"\\u{ord(m[0]):04x}"), s)


def raw_bytes(s: str) -> bytes:
    """The bytes ``s`` was decoded from (``os.fsencode``'s inverse of a file name), lone surrogates included."""
    return s.encode("utf-8", "surrogateescape") if not re.search("[\ud800-\udc7f\udd00-\udfff]", s) \
        else s.encode("utf-8", "surrogatepass")


def strict(obj: Any, keep_bytes: bool = True) -> Any:
    """A copy of a JSON-like value whose every string (keys too) is valid UTF-8 (:func:`readable`).  With
    ``keep_bytes``, a dict's string value that had to be changed gets a sibling ``<key>_b64`` holding its raw
    bytes in base64 (unless the dict has that key already).  The value itself when nothing needs changing
    (the common case costs one scan); iterative, any depth."""
    if _all_strict(obj):
        return obj
    root: list[Any] = [None]
    stack: list[tuple[Any, Any, Any]] = [(obj, root, 0)]
    while stack:
        src, parent, key = stack.pop()
        if isinstance(src, dict):
            dst: Any = {}
            for k, v in src.items():
                k2 = readable(k) if isinstance(k, str) else k
                dst[k2] = None  # (the keys keep their order; the values are filled in as the walk reaches them)
                stack.append((v, dst, k2))
                if keep_bytes and isinstance(v, str) and isinstance(k, str) and not is_strict(v) \
                        and f"{k}_b64" not in src:
                    dst[f"{k2}_b64"] = base64.b64encode(raw_bytes(v)).decode("ascii")
        elif isinstance(src, (list, tuple)):
            dst = [None] * len(src)
            for i, v in enumerate(src):
                stack.append((v, dst, i))
        else:
            dst = readable(src) if isinstance(src, str) else src
        parent[key] = dst
    return root[0]


def _all_strict(obj: Any) -> bool:
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, str):
            if not is_strict(o):
                return False
        elif isinstance(o, dict):
            for k, v in o.items():
                if isinstance(k, str) and not is_strict(k):
                    return False
                stack.append(v)
        elif isinstance(o, (list, tuple)):
            stack.extend(o)
    return True
