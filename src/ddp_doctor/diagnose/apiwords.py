"""Collectives in the words of the API the user called (``ddp_doctor.apis``): ``dcp.save``, an FSDP2 module's
forward, ``consolidate_state_dict`` -- with the collective torch issued inside it as the detail.  The user
never wrote the ``gather_object`` inside ``dcp.save``; the fix is about the call they did write."""
from __future__ import annotations

from ddp_doctor.apis import collective_why
from ddp_doctor.evidence import GROUP_CREATION, Collective, RankState, Site, SiteCount

from ddp_doctor.diagnose.common import where
from ddp_doctor.diagnose.decision import user_stack
from ddp_doctor.diagnose.source import under_rank_branch


def api_of(c: Collective | None) -> str | None:
    """The table API ``c`` was issued inside, if any."""
    return c.site.api if c is not None and c.site is not None else None


def _named(api: str) -> str:
    return api if api.startswith("the ") else f"`{api}`"


def op_text(c: Collective, args: str = "") -> str:
    """"all_reduce(4x4)", or "`dcp.save` (gather_object inside it)" for a call issued inside an API."""
    api = api_of(c)
    return f"{_named(api)} ({c.op}{args} inside it)" if api else f"{c.op}{args}"


def called(c: Collective, site: Site | None) -> str:
    """The culprit's call as the subject of a DDP201 sentence: "called barrier() at x.py:3", or "entered
    `dcp.save` at x.py:34" for a call issued inside an API."""
    api = api_of(c)
    return f"entered {_named(api)} at {where(site)}" if api else f"called {c.op}() at {where(site)}"


def why_all(c: Collective) -> str:
    """" `dcp.save` is collective: every rank must call it (...; torch issued gather_object inside it)."""
    api = api_of(c)
    if not api:
        return ""
    why = collective_why(api)
    inside = f"torch issued {c.op} inside it"
    why = why[:-1] + f"; {inside})" if why.endswith(")") else f"{why} ({inside})"
    return f" {why[0].upper()}{why[1:]}."


def api_parting(ranks: dict[int, RankState]) -> tuple[list[int], dict] | None:
    """Where ranks parted inside an API before a mismatch showed: the first position whose calls agree as torch
    sees them, at least one issued inside a table API, some ranks at a line no other rank ever issued a
    collective at (rank 0's evaluation through an FSDP2 model: its all-gathers pair silently with rank 1's
    next training forward, and only later a reduce-scatter meets an all-gather).  (those ranks, the calls),
    or None.  Ranks killed by a signal are judged by their last post (``_past_the_dead``).
    Explains a proof, never makes one."""
    fps = {r: {(c.group, c.seq): c for c in st.fingerprints} for r, st in ranks.items()
           if st.fingerprints and not st.missing}
    if len(fps) < 2:
        return None
    common = set.intersection(*(set(m) for m in fps.values()))
    seen = {r: ranks[r].lines_seen() for r in fps}
    for key in sorted(common, key=lambda k: (k[1] if k[1] is not None else -1, str(k[0]))):
        calls = {r: m[key] for r, m in fps.items()}
        vals = list(calls.values())
        if any(c.join or c.site is None for c in vals) or key[0] == GROUP_CREATION:
            continue
        if len({c.must_agree() for c in vals}) > 1:
            return None  # the ranks disagree here already: that is the proof, not a parting before it
        if not any(c.site.api for c in vals) or len({c.site.key() for c in vals}) < 2:
            continue
        fault = sorted(r for r, c in calls.items()
                       if all(c.site.key() not in seen[o] for o in calls if o != r))
        if 0 < len(fault) < len(calls):
            return fault, calls
    return _past_the_dead(ranks, fps, seen)


def _past_the_dead(ranks: dict[int, RankState], fps: dict, seen: dict) -> tuple[list[int], dict] | None:
    """A rank killed by a signal (gloo's abort on the mismatch) posted its calls up to 0.25 s before it died:
    past its last known position, the first call the live ranks issued inside an API at a line the dead
    ones never issued a collective at (their calls there unknown: None)."""
    dead = [r for r in fps if ranks[r].exit is not None and ranks[r].exit.killed]
    live = [r for r in fps if r not in dead]
    if not dead or not live:
        return None
    beyond = sorted({k for r in live for k in fps[r] if k[1] is not None and all(k not in fps[d] for d in dead)
                     and any(k[0] == g for d in dead for g, _ in fps[d])}, key=lambda k: (k[1], str(k[0])))
    for key in beyond:
        calls = {r: fps[r].get(key) for r in fps}
        mine = {r: c for r, c in calls.items() if r in live and c is not None and c.site is not None}
        if len(mine) != len(live) or len({c.must_agree() for c in mine.values()}) > 1:
            return None
        fault = sorted(r for r, c in mine.items() if c.site.api and all(c.site.key() not in seen[d] for d in dead))
        if fault:
            return fault, calls
    return None


def _count_at(st: RankState, op: str, key: tuple) -> int:
    return sum(sc.calls for sc in st.site_counts if sc.op == op and sc.site is not None and sc.site.key() == key)


def went_alone(ranks: dict[int, RankState]) -> tuple[list[int], SiteCount] | None:
    """Ranks that issued collectives inside an API at a line inside a branch on the rank (or in a helper only such
    a branch calls) that no other rank ever ran (a rank-0 evaluation through an FSDP2 model: its all-gathers paired silently with the others' training,
    and it stands at a shared line again by the time the mismatch shows): (those ranks, that line's count), or
    None.  Facts: the probe's per-line counts and every rank's lines seen; the branch read from the source."""
    hits: dict[tuple, tuple[list[int], SiteCount]] = {}
    files = tuple(sorted({fr.path for st in ranks.values() for fr in user_stack(st)}))  # the job's own files
    for r, st in sorted(ranks.items()):
        others = [o for o in ranks if o != r and not ranks[o].missing]
        for sc in st.site_counts:
            if sc.site is None or not sc.site.api or not others:
                continue
            key = sc.site.key()
            if any(key in ranks[o].lines_seen() for o in others) or not under_rank_branch(sc.site, files):
                continue
            hits.setdefault(key, ([], sc))[0].append(r)
    found = [v for v in hits.values() if len(v[0]) < len(ranks)]
    return min(found, key=lambda v: v[1].site.line) if found else None


def more_often(calls: dict[int, Collective | None], ranks: dict[int, RankState]) -> tuple[list[int], str] | None:
    """Ranks that entered an API at a line every rank runs, once more than the others: at the mismatch they
    are at that line (an FSDP2 model's forward in a loop of per-rank micro-batches) while the others went
    on past it.  The others are not the ones "calling alone": they finished the loop.  (those ranks, the
    per-rank counts in words), or None."""
    known = {r: c for r, c in calls.items() if c is not None and c.site is not None and r in ranks}
    if any(c.op.startswith("ddp.") for c in known.values()):
        return None  # a DDP training loop: uneven steps (DDP101) say who skipped, not who stepped more
    extra = []
    for r, c in known.items():
        if not c.site.api:
            continue
        key, others = c.site.key(), [o for o in known if o != r]
        if not others or any(known[o].site.key() == key for o in others):
            continue
        if not all(key in ranks[o].lines_seen() for o in others):
            continue  # a line the others never ran: a rank-conditional call, not a longer loop
        if any(under_rank_branch(f) for o in others for f in [known[o].site, *user_stack(ranks[o])]):
            continue  # another went into a branch on the rank: that one went alone, not this one on longer
        mine = _count_at(ranks[r], c.op, key)
        if mine and all(_count_at(ranks[o], c.op, key) < mine for o in others):
            extra.append(r)
    if not extra or len(extra) == len(known):
        return None
    c = known[extra[0]]
    counts = ", ".join(f"rank {r}: {_count_at(ranks[r], c.op, c.site.key())}" for r in sorted(known))
    return sorted(extra), f"{c.op} calls at that line: {counts}"
