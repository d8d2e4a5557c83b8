"""The odd rank out: whom to blame when ranks' calls differ, and whether lint flags the culprits' line.

One policy for every evidence source.  ``run``'s probe states (``diagnose/collectives.py``), ``attach``'s
stack samples (``attach/assess.py``) and Flight Recorder dumps (``flightrec.py``) are each turned into
:class:`evidence.Collective` records by their adapter first, so one situation gets one code, one culprit
and one line wherever it was seen (docs/verdicts.md, "The culprit")."""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from ddp_doctor.diagnose.apiwords import more_often, went_alone
from ddp_doctor.diagnose.common import same_line
from ddp_doctor.diagnose.live import group_ranks
from ddp_doctor.evidence import GROUP_CREATION, Collective, LintMark, RankState, Site, SiteCount
from ddp_doctor.findings import Finding

# lint's codes that say "this line is reached under a rank-dependent condition"
RANK_CONDITIONAL = ("DDP201", "DDP202")
# why the history blames ranks, when it is not that their calls at this position differ (``Blame.why``)
MORE_OFTEN = "more-often"  # they entered an API once more than the others, at a line every rank runs
WENT_ALONE = "went-alone"  # they issued collectives inside an API in a branch on the rank no other rank ran


@dataclass(frozen=True)
class Blame:
    """The ranks at fault, the code, and the line to show; ``lint_seen``: the code is lint's (it flags that
    line), not inferred from where the ranks stand; ``why``: what in their history blames them (``MORE_OFTEN``
    with the per-rank ``counts`` in words, ``WENT_ALONE`` with the line's count ``alone``), None when their
    calls differ."""

    code: str
    ranks: tuple[int, ...]
    site: Site | None
    lint_seen: bool = False
    why: str | None = None
    counts: str = ""
    alone: SiteCount | None = None

    def unpack(self) -> tuple[str, list[int], Site | None]:
        """(code, ranks at fault, their line), as run's wording takes them."""
        return self.code, list(self.ranks), self.site


def ddp_own(c: Collective) -> bool:
    """A collective DDP issues itself (parameter / buffer broadcast, gradient all-reduce), not the user's code."""
    return c.origin == "ddp" or c.op.startswith("ddp.")


def agreement(c: Collective) -> tuple:
    """What two ranks' calls must share to be one call: torch's rule (``must_agree``) at a known position;
    without one (``attach`` sees only where each rank stands, not which calls pair) also the line."""
    if c.seq is not None:
        return c.must_agree()
    return (c.op, c.site.key() if c.site else None)


def _agreeing(calls: Mapping[int, Collective | None]) -> dict[tuple, list[int]]:
    """The ranks (ascending) of each set of calls that agree; ranks outside collectives (None) are in none."""
    groups: dict[tuple, list[int]] = {}
    for r, c in sorted(calls.items()):
        if c is not None:
            groups.setdefault(agreement(c), []).append(r)
    return groups


def odd_ones_out(calls: Mapping[int, Collective | None]) -> tuple[list[int], Site | None]:
    """The ranks outside a clear majority of agreeing calls (every rank when there is none), and the lowest
    such rank's line."""
    groups = _agreeing(calls)
    if not groups:
        return [], None
    ranked = sorted(groups.values(), key=len, reverse=True)
    clear = len(ranked) > 1 and len(ranked[0]) > len(ranked[1])
    fault = sorted(r for g in (ranked[1:] if clear else ranked) for r in g)
    site = calls[fault[0]].site  # type: ignore[union-attr]
    return fault, site


def group_members(group: str | None, world: list[int]) -> list[int] | None:
    """Global ranks of a group key as the probe writes it ("world", "pg:0,1"); None when unknown ("pg?")."""
    if group in (None, "world", GROUP_CREATION):
        return list(world)
    members = group_ranks(group, len(world))
    return None if members is None else sorted(members)


def not_members_passed(calls: Mapping[int, Collective | None], ranks: Mapping[int, RankState]
                       ) -> tuple[list[int], Collective | None]:
    """Members of a group others wait in that called the same collective at the same line with a group they
    are not in (torch skipped the call with a warning): they went on while the members wait for them.
    Returns (those ranks, the members' call they skipped)."""
    world = sorted(ranks)
    waits = [c for c in calls.values() if c and c.site and not c.op.startswith("ddp.")]
    out, skipped = set(), None
    for r, mine in calls.items():
        st = ranks.get(r)
        for w in waits if st is not None and st.not_member else ():
            here = mine is not None and mine.site is not None and mine.site.key() == w.site.key()
            if not here and r in (group_members(w.group, world) or ()) and any(
                    sc.op == w.op and sc.site is not None and sc.site.key() == w.site.key() for sc in st.not_member):
                out.add(r)
                skipped = skipped or w
    return sorted(out), skipped


def thread_ran_on(calls: Mapping[int, Collective | None], ranks: Mapping[int, RankState]) -> list[int]:
    """Ranks whose call is made by a thread of their own (not the main thread) that the group's other
    members no longer run: none of their threads stands in that function, though they made calls at that
    line before.  Such a thread made more calls than the others' (a rank-local count), and its extra call
    has no partner; the others' calls elsewhere (a final barrier) only wait for it."""
    def where_thread(st: RankState, site: Site):
        return next((t for t in st.threads if any(f.path == site.path and f.line == site.line for f in t.frames)), None)

    out = []
    for r, c in calls.items():
        st = ranks.get(r)
        t = where_thread(st, c.site) if st is not None and c is not None and c.site is not None else None
        if t is None or t.main:
            continue
        others = [ranks[o] for o in calls if o != r and o in ranks]
        base = os.path.basename(c.site.path)
        if others and all(o.threads and not any(os.path.basename(f.path) == base and f.function == c.site.function
                                                 for th in o.threads for f in th.frames)
                          and any(sc.op == c.op and sc.site is not None and sc.site.key() == c.site.key() and sc.calls
                                  for sc in o.site_counts) for o in others):
            out.append(r)
    return sorted(out)


def lint_code_at(lint: Sequence[LintMark] | None, site: Site | None) -> str | None:
    """The rank-conditional code lint reports on ``site``'s line (``same_line``), if any."""
    if site is None:
        return None
    return next((m.code for m in lint or () if m.code in RANK_CONDITIONAL
                 and same_line(m.path, m.line, site.path, site.line)), None)


def blame_calls(calls: Mapping[int, Collective | None], lint: Sequence[LintMark] | None = None,
                ranks: Mapping[int, RankState] | None = None) -> Blame:
    """Whom to blame where ranks' calls differ (``run``: at one collective position, None for a rank outside
    collectives; ``attach``: where each is stuck; Flight Recorder: one sequence number).

    One order for every source, the firmest fact first: what the ranks' history proves, where there is one
    (``ranks``: run's probe states; an API entered once more than the others at a shared line, a line the
    others never ran is a fact, and one they did run refutes "a collective only some ranks call"); without it,
    where each rank stands against DDP's own collectives; then the one group of agreeing calls lint flags as
    rank-conditional; else the ranks outside the majority (DDP203)."""
    b = (_by_history(calls, ranks) if ranks is not None else _by_position(calls, lint)) or _by_lint(calls, lint, ranks)
    if b is not None:
        return b
    fault, site = odd_ones_out(calls)
    return Blame("DDP203", tuple(fault), site)


def _by_lint(calls: Mapping[int, Collective | None], lint: Sequence[LintMark] | None,
             ranks: Mapping[int, RankState] | None) -> Blame | None:
    """The one set of agreeing calls, fewer than all the ranks, at a line lint flags as rank-conditional: the
    script says which branch only some ranks take.  Where the ranks' history is known, a line another rank ran
    too refutes it (not a branch only these ranks take).  Explains calls that already disagree, never makes a
    proof."""
    known = {r: c for r, c in calls.items() if c is not None and c.site is not None and c.group != GROUP_CREATION}
    flagged = [rs for rs in _agreeing(known).values() if lint_code_at(lint, known[rs[0]].site)]
    if len(flagged) != 1 or len(flagged[0]) >= len(calls):
        return None
    site = known[flagged[0][0]].site
    if ranks is not None and any(site.key() in _st(ranks, o).lines_seen()  # type: ignore[union-attr]
                                 for o in calls if o not in flagged[0]):
        return None
    return Blame(lint_code_at(lint, site) or "DDP201", tuple(flagged[0]), site, lint_seen=True)


def _by_position(calls: Mapping[int, Collective | None], lint: Sequence[LintMark] | None) -> Blame | None:
    """Without a history (a stack, a dump): ranks in the user's own collective while the others are in DDP's
    (a collective only some reach: DDP201, or DDP202 when a subset runs DDP's forward)."""
    there = {r: c for r, c in sorted(calls.items()) if c is not None}
    own = [r for r, c in there.items() if ddp_own(c)]
    user = [r for r in there if r not in own]
    if user and own:
        fwd = [r for r in own if there[r].op.startswith("ddp.forward")]
        if fwd and len(fwd) < len(own) and len({agreement(there[r]) for r in fwd}) == 1:
            return Blame("DDP202", tuple(fwd), there[fwd[0]].site)
        same_op = len({c.op for c in there.values()}) == 1
        if not same_op and len({agreement(there[r]) for r in user}) == 1:
            site = there[user[0]].site
            return Blame(lint_code_at(lint, site) or "DDP201", tuple(user), site)
    return None


def _by_history(calls: Mapping[int, Collective | None], ranks: Mapping[int, RankState]) -> Blame | None:
    """What the ranks' history proves (``run``'s probe: the collectives each rank ever issued and where, how
    often, its DDP forwards): ranks that entered an API once more than the others at a line every rank runs --
    unless another rank went alone into an API under a branch on the rank first, which put them ahead
    (DDP201); ranks in a DDP forward or a collective at a line the others never ran (DDP202, DDP201)."""
    longer = more_often(dict(calls), dict(ranks)) if _paired(calls) else None
    if longer is not None:
        alone = went_alone(dict(ranks))
        if alone is not None:
            return Blame("DDP201", tuple(alone[0]), alone[1].site, why=WENT_ALONE, alone=alone[1])
        first = calls[longer[0][0]]
        return Blame("DDP201", tuple(longer[0]), first.site if first else None, why=MORE_OFTEN, counts=longer[1])
    seen = {r: _st(ranks, r).sites_seen for r in calls}
    # a rank killed by a signal published its last state up to 0.25 s before: what it "never ran" is unknown
    reliable = {o for o in calls if not (_st(ranks, o).exit and _st(ranks, o).exit.killed)}

    def unseen_by_others(r, c):
        k = (c.op, c.site.key() if c.site else None)
        others = [o for o in calls if o != r and calls[o] is not None and o in reliable]
        return bool(others) and all(k not in seen[o] for o in others)

    def others_ran_ddp(r):
        # "the DDP model where the others never run it" needs others that did run it: a rank that has not
        # made a single DDP forward yet (stuck in a collective before training) is the odd one out instead
        return all(_st(ranks, o).forwards > 0 for o in calls if o != r and calls[o] is not None)

    subset = [r for r, c in calls.items() if c and c.op.startswith("ddp.forward") and unseen_by_others(r, c)
              and others_ran_ddp(r)]
    if subset:
        return Blame("DDP202", tuple(subset), calls[subset[0]].site)
    subset, site = ddp_subset_forwards(dict(ranks))
    if subset and any(c and c.op.startswith("ddp.") for c in calls.values()):
        return Blame("DDP202", tuple(subset), site)
    # DDP201: some ranks issue a collective at a line where the others never issued one, while the others
    # are on the common path: in DDP's own collectives, or at a line the culprits issue collectives at too
    # (Lightning's per-batch broadcast at `trainer.fit`, a metric all_reduce every rank makes each step).
    # Before the DDP-op check below: a DDP backward the culprit has not reached yet is not a subset's.
    lines = {r: _st(ranks, r).lines_seen() for r in calls}
    subset = [r for r, c in calls.items()
              if c and not c.op.startswith("ddp.") and _line_unseen(r, c, calls, lines, reliable)]

    def common_path(c):
        return c.op.startswith("ddp.") or (c.site is not None and all(c.site.key() in lines[r] for r in subset))

    if subset and len(subset) < len(calls) and all(not c or r in subset or common_path(c) for r, c in calls.items()):
        return Blame("DDP201", tuple(subset), calls[subset[0]].site)
    subset = [r for r, c in calls.items() if c and c.op.startswith("ddp.") and c.op != "ddp.init(broadcast_params)"
              and unseen_by_others(r, c) and others_ran_ddp(r)]
    if subset and len(subset) < len(calls):
        return Blame("DDP202", tuple(subset), calls[subset[0]].site)
    return None


def _paired(calls: Mapping[int, Collective | None]) -> bool:
    """Every rank's call at one known position (a group and its sequence number): the calls were paired, so a
    rank that entered an API more often than another did so before the same point of their shared collective
    order -- a longer loop.  Calls of different positions (ranks blocked in several groups) prove no such
    thing: a rank a step ahead has entered it more often too."""
    pos = {(c.group, c.seq) for c in calls.values() if c is not None}
    return None not in calls.values() and len(pos) == 1 and next(iter(pos))[1] is not None


def _line_unseen(r: int, c: Collective, calls: Mapping[int, Collective | None], lines: dict[int, set],
                 reliable: set[int]) -> bool:
    """No other rank (whose record is reliable) ever issued any collective at ``c``'s line, and no other rank's
    call stands at it now (a rank killed by a signal: its history may be stale, where it stood is not).  The
    others include ranks outside collectives now (None): what they ever ran is still on record."""
    others = [o for o in calls if o != r and o in reliable]
    here = any(x is not None and x.site is not None and x.site.key() == c.site.key()
               for o, x in calls.items() if o != r) if c.site is not None else False
    return c.site is not None and bool(others) and not here and all(c.site.key() not in lines[o] for o in others)


def ddp_forward_sites(st: RankState) -> dict[tuple, tuple[Site, int]]:
    """{(file name, line, function): (site, calls)} of the DDP model's forward calls on one rank that took part
    in a collective (DDP broadcast the buffers).  A forward that issued none -- under no_grad, of a model
    without buffers (nanoGPT's rank-0 evaluation) -- pairs with nothing: harmless on a subset of ranks."""
    synced = {sc.site.key() for sc in st.site_counts if sc.op == "ddp.forward(broadcast_buffers)" and sc.site}
    return {sc.site.key(): (sc.site, sc.calls) for sc in st.site_counts
            if sc.op == "ddp.forward" and sc.site and sc.site.key() in synced}


def _st(ranks: Mapping[int, RankState], r: int) -> RankState:
    return ranks.get(r) or RankState(rank=r, missing=True)


def ddp_subset_forwards(ranks: dict[int, RankState]) -> tuple[list[int], Site | None]:
    """Ranks that called the DDP model at a line no other rank ever called it at (and that line)."""
    per = {r: ddp_forward_sites(st) for r, st in ranks.items() if not st.missing}
    if len(per) < 2:
        return [], None
    only: dict[tuple, list[int]] = {}
    fwd = {r: ranks[r].forwards for r in per}
    for r, sites in per.items():
        for k, (_s, n) in sites.items():
            others = [o for o in per if k not in per[o]]
            # the others must have done at least the forwards this rank did elsewhere (not merely be behind)
            if others and all(fwd[o] > 0 and fwd[o] >= fwd[r] - n for o in others):
                only.setdefault(k, []).append(r)
    if not only:
        return [], None
    # the line run by the fewest ranks, most calls
    k = min(only, key=lambda k: (len(only[k]), -sum(per[r][k][1] for r in only[k])))
    return sorted(only[k]), per[only[k][0]][k][0]


def lint_mark(f: Finding) -> LintMark:
    """A lint finding (one with a location) as the runtime uses it; its first related location is the cause
    when it has one."""
    rel = next(iter(f.evidence.get("related") or ()), None)  # lint's {"path", "line", "message"}
    cause = None
    if isinstance(rel, dict) and rel.get("line"):
        cause = Site(os.path.abspath(rel["path"]), int(rel["line"]), None)
    return LintMark(f.code, f.location.path, f.location.line, cause)  # type: ignore[union-attr]


def lint_rank_conditional(paths: Iterable[str]) -> tuple[LintMark, ...]:
    """lint's rank-conditional findings in the user's files the ranks stand in (``attach``, Flight Recorder:
    no lint ran before the job).  A hint, never required: a file that is gone or a lint that fails leaves the
    diagnosis to what the ranks show."""
    files = sorted({p for p in paths if p.endswith(".py") and os.path.isfile(p)})
    if not files:
        return ()
    try:
        from ddp_doctor.lint import lint_paths

        res = lint_paths(files, select=list(RANK_CONDITIONAL))
    except Exception:  # noqa: BLE001 - lint is a hint here; it never breaks the diagnosis
        return ()
    return tuple(lint_mark(f) for f in res.findings if f.location)
