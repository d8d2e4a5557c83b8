"""Collectives in the words of the API the user called (``ddp_doctor.apis``): ``dcp.save``, an FSDP2 module's
forward, ``consolidate_state_dict`` -- with the collective torch issued inside it as the detail.  The user
never wrote the ``gather_object`` inside ``dcp.save``; the fix is about the call they did write."""
from __future__ import annotations

from ddp_doctor.apis import collective_why
from ddp_doctor.evidence import GROUP_CREATION, Collective, RankState, Site

from ddp_doctor.diagnose.common import lint_flagged, where


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


def lint_subset(calls: dict[int, Collective | None], ranks: dict[int, RankState], lint) -> list[int]:
    """The ranks whose call is at a line lint flagged as rank-conditional (DDP201), when those are some but not
    all of the ranks and every rank is at a line the others never ran: at this instant the position shows
    only that the ranks disagree; the script says which branch only some ranks take.  Explains a proof
    (the calls already disagree), never makes one."""
    known = {r: c for r, c in calls.items() if c is not None and c.site is not None and c.group != GROUP_CREATION}
    if len(known) < 2 or not lint:
        return []
    flagged = [r for r, c in known.items() if lint_flagged(lint, "DDP201", c.site)]
    if not flagged or len(flagged) == len(known):
        return []
    seen = {r: {k for _op, k in ranks[r].sites_seen} for r in known if r in ranks}
    flagged_lines = {known[r].site.key() for r in flagged}
    if any(k in seen.get(o, ()) for k in flagged_lines for o in known if o not in flagged):
        return []  # the others ran that line too: not a branch only these ranks take
    return sorted(flagged)
