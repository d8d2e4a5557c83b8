"""Runtime findings worded once: a draft and the policy's ruling on it become the ``Finding`` the report
shows -- where the ranks parted (the decision's facts), what showed where it showed, what happens next, and
whether lint flagged the line before the run.  Nothing edits a finding after this."""
from __future__ import annotations

from ddp_doctor.diagnose.common import same_hazard, same_line
from ddp_doctor.diagnose.draft import Draft, Ruling
from ddp_doctor.diagnose.ruling import rule
from ddp_doctor.evidence import LintMark, RankState
from ddp_doctor.findings import Finding, Location


def decided(drafts: list[Draft], ranks: dict[int, RankState], lint: tuple[LintMark, ...] = ()) -> list[Finding]:
    """Every draft ruled on (``ruling.rule``) and worded (:func:`word`)."""
    return [word(d, rule(d, ranks), lint) for d in drafts]


def word(d: Draft, r: Ruling, lint: tuple[LintMark, ...] = ()) -> Finding:
    """The finding: located at the decision when there is one (the line where it showed kept in
    ``evidence["showed_at"]``), its sentences in the order decision, showing, the path taken alone, the stall
    policy's next step, lint's confirmation."""
    evidence = dict(d.evidence)
    location, sentences = d.location, []
    dec = r.decision
    if dec is not None:
        evidence["decision"] = dec.to_json()
        if location is not None and (location.path, location.line) != (dec.site.path, dec.site.line):
            evidence["showed_at"] = location.to_report_dict()
        location = Location(dec.site.path, dec.site.line, dec.site.function)
        sentences.append(dec.text())
    if r.recoded_from is not None:
        evidence["recoded_from"] = r.recoded_from
    sentences.append(d.said)
    if r.alone:
        sentences.append(f"Rank {', '.join(map(str, r.alone))}'s call is on a path the others do not take.")
    message = " ".join([*sentences, *d.then])
    mark = _confirmed(lint, r.code, [x for x in (location, d.location) if x is not None])
    if mark is not None:
        evidence["lint"] = {"code": mark.code, "path": mark.path, "line": mark.line}
        message += f" ddp-doctor lint flagged this line before the run ({mark.code}): the static warning came true."
    return Finding(r.code, message, r.fix, location=location, severity=d.severity if r.code == d.code else None,
                   ranks=sorted(r.ranks), evidence=evidence, title=d.title if r.code == d.code else None)


def _confirmed(lint: tuple[LintMark, ...], code: str, locations: list[Location]) -> LintMark | None:
    """The first lint finding on the decision's line or the line where it showed, of the same hazard."""
    return next((m for m in lint if same_hazard(m.code, code)
                 and any(same_line(m.path, m.line, x.path, x.line) for x in locations)), None)
