"""DDP201 inside DDP's ``Join``: a collective of the user's own, called by a rank still training after
another rank ran out of inputs and joined.

``Join`` lets ranks with fewer inputs leave the loop: a joined rank sits in ``Join.__exit__`` and shadows
its joinables' collectives (DDP's join notification and gradient all-reduce, a ZeRO optimizer's broadcasts)
for the ranks still training -- and nothing else.  An ``all_reduce`` of a logged loss in the Join block is
then paired with a shadow call of another size: gloo aborts, or the job hangs.  Positions inside a Join are
never compared (ranks legitimately differ there), so this rests on facts once a rank failed: one rank's
stack is in ``Join.__exit__`` (joined), another's last calls inside the Join include one issued directly at
a line of the user's that calls a collective (lint's model of the line), not inside a torch API.
"""
from __future__ import annotations

import ast
import os

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.evidence import Collective, JobEvidence, RankState, Site
from ddp_doctor.frames import is_user
from ddp_doctor.findings import runtime_fix
from ddp_doctor.diagnose.common import loc, ranks_of, where
from ddp_doctor.diagnose.source import function_at, lint_model, parse_file

JOIN_PY = os.sep + os.path.join("algorithms", "join.py")
JOIN_SHADOW = "join_shadow"  # evidence key: the decision is the collective's place, not a branch


def joined_at(st: RankState) -> Site | None:
    """The user's line a rank joined at (its `with Join(...)`), when its stack -- or the traceback it
    failed with -- is inside ``Join.__exit__``: it had run out of inputs and was shadowing the others."""
    for frames in (st.stack, st.exc.traceback if st.exc is not None else ()):
        frames = list(frames or ())
        i = next((i for i, f in enumerate(frames) if f.path.endswith(JOIN_PY) and f.function == "__exit__"), None)
        if i is not None:
            user = [f for f in frames[:i] if is_user(f.path)]
            return user[-1] if user else frames[i]
    return None


def _calls_collective(site: Site) -> bool:
    """Does the user's line itself call a collective (lint's model: ``dist.all_reduce``, ``accelerator.gather``)?"""
    parsed = parse_file(site.path)
    model = lint_model(site.path) if parsed is not None else None
    if model is None:
        return False
    fn = function_at(parsed[0], site.function, site.line)
    scope = model.scopes.get(fn)
    for node in ast.walk(fn):
        if isinstance(node, ast.Call) and node.lineno <= site.line <= (node.end_lineno or node.lineno):
            try:
                if scope is not None and model.collective_name(node, scope):
                    return True
            except Exception:  # noqa: BLE001 - a line lint cannot model: not evidence
                return False
    return False


def _own_call_in_join(st: RankState) -> Collective | None:
    """The latest collective this rank issued inside a Join directly at a user line that calls one."""
    calls = [c for c in (st.in_collective, st.last_collective) if c is not None] + list(reversed(st.fingerprints))
    for c in calls:
        if c.join and c.site is not None and c.site.api is None and not c.op.startswith("ddp.") \
                and _calls_collective(c.site):
            return c
    return None


def diagnose_join_own_collective(ev: JobEvidence) -> list[Draft]:
    """DDP201 on the ranks that called their own collective inside a Join that another rank had joined."""
    ranks = ranks_of(ev)
    if not any(st.failed for st in ranks.values()):
        return []
    joined = {r: s for r, st in ranks.items() if (s := joined_at(st)) is not None}
    if not joined:
        return []
    own = {r: c for r, st in ranks.items() if r not in joined and (c := _own_call_in_join(st)) is not None}
    if not own:
        return []
    first = min(own)
    c, j = own[first], joined[min(joined)]
    who = ", ".join(map(str, sorted(joined)))
    msg = (f"Rank{'s' if len(joined) > 1 else ''} {who} ran out of inputs and joined DDP's Join (in `Join.__exit__` "
           f"at {where(j)}), shadowing the collectives of the Join's joinables for the ranks still training; rank "
           f"{', '.join(map(str, sorted(own)))} went on calling {c.op} at {where(c.site)}, a collective of your own "
           "inside the Join block. Join shadows only its joinables' collectives (DDP's join notification and "
           "gradient all-reduce), never yours: this call was paired with a joined rank's shadow call of another "
           "size, and the job failed. Move the collective out of the `with Join(...)` block (after it, where every "
           "rank calls it), or keep the ranks' inputs even so that no rank joins early.")
    return [Draft("DDP201", msg, runtime_fix("DDP201.join"), location=loc(c.site), ranks=sorted(own),
                  evidence={JOIN_SHADOW: True, "joined": {str(r): s.to_json() for r, s in sorted(joined.items())},
                          "call": {str(r): x.to_json() for r, x in sorted(own.items())}}, join_shadow=True)]
