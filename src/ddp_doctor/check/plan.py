"""What ``check`` runs: the ordered tests, message sizes and the bus-bandwidth formula."""
from __future__ import annotations

import re

#: Tests in the order every rank runs them.  Point-to-point tests come first so a single
#: bad rank or pair is isolated by name before the collectives (which would only time out).
P2P_TESTS = ("ring", "pairs")
COLLECTIVE_TESTS = ("barrier", "broadcast", "all_gather", "all_reduce")
ALL_TESTS = ("rendezvous",) + P2P_TESTS + COLLECTIVE_TESTS

DEFAULT_SIZES = (4 * 1024, 256 * 1024, 4 * 1024 * 1024)

_UNITS = {"": 1, "B": 1, "K": 1024, "KB": 1024, "KIB": 1024, "M": 1024 ** 2, "MB": 1024 ** 2,
          "MIB": 1024 ** 2, "G": 1024 ** 3, "GB": 1024 ** 3, "GIB": 1024 ** 3}


def parse_size(text: str) -> int:
    """``"4K"`` -> 4096, ``"1M"`` -> 1048576, ``"512"`` -> 512 (bytes; binary units)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (use e.g. 4K, 256K, 4M)")
    value = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if value <= 0:
        raise ValueError(f"size must be positive: {text!r}")
    return value


def parse_sizes(text: str) -> list[int]:
    """A comma-separated list of sizes, sorted and de-duplicated."""
    return sorted({parse_size(part) for part in text.split(",") if part.strip()})


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1024 ** 3), ("MiB", 1024 ** 2), ("KiB", 1024)):
        if nbytes >= scale:
            value = nbytes / scale
            return f"{value:.0f} {unit}" if value == int(value) else f"{value:.1f} {unit}"
    return f"{nbytes} B"


def algbw(nbytes: int, seconds: float) -> float:
    """Algorithm bandwidth in bytes/s: message size over time (nccl-tests ``algbw``)."""
    return nbytes / seconds if seconds > 0 else 0.0


def busbw_factor(op: str, world_size: int) -> float:
    """nccl-tests' correction from algbw to bus bandwidth (``doc/PERFORMANCE.md``).

    all_reduce: 2(n-1)/n; all_gather / reduce_scatter: (n-1)/n; broadcast / reduce: 1.
    """
    n = world_size
    if n <= 1:
        return 0.0 if op in ("all_reduce", "all_gather", "reduce_scatter") else 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    if op in ("broadcast", "reduce"):
        return 1.0
    raise ValueError(f"no bus-bandwidth factor for {op!r}")


def busbw(op: str, nbytes: int, seconds: float, world_size: int) -> float:
    """Bus bandwidth in bytes/s: ``algbw * factor`` — comparable with the hardware's link speed."""
    return algbw(nbytes, seconds) * busbw_factor(op, world_size)


def pair_rounds(world_size: int) -> list[list[tuple[int, int]]]:
    """Every pair of ranks, scheduled in rounds where each rank is in at most one pair.

    The circle method: n-1 rounds for even n, n rounds for odd n; all pairs exactly once.
    """
    n = world_size
    if n < 2:
        return []
    players: list[int | None] = list(range(n)) + ([None] if n % 2 else [])
    m = len(players)
    rounds = []
    for _ in range(m - 1):
        pairs = []
        for i in range(m // 2):
            a, b = players[i], players[m - 1 - i]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        rounds.append(sorted(pairs))
        players = [players[0], players[-1]] + players[1:-1]
    return rounds


def partner(rounds_entry: list[tuple[int, int]], rank: int) -> int | None:
    for a, b in rounds_entry:
        if rank == a:
            return b
        if rank == b:
            return a
    return None


MIN_PAIR_SLOT_S = 0.5


def test_deadline(test: str, deadline: float, world_size: int, nnodes: int = 1) -> float:
    """The deadline of one test: ``deadline``, except that every-pair gets at least
    MIN_PAIR_SLOT_S per round (n-1 rounds), so many ranks on one node are not failed for slowness."""
    if test == "pairs" and nnodes <= 1 and world_size > 2:
        return max(deadline, MIN_PAIR_SLOT_S * len(pair_rounds(world_size)) / 0.9)
    return deadline
