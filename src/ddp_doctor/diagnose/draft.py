"""A runtime finding before it is worded (``Draft``) and the policy's ruling on it (``Ruling``).

A code family's module says what it saw: the code and ranks the showing alone implies, the line it showed
at, what showed there (a sentence of facts about the collectives and lines), and the typed facts the
policy decides with.  ``ruling.rule`` then decides, once, where the ranks parted, the code and the culprit
ranks; ``wording.word`` writes the finding once from both.  Nothing is edited after wording, and no
``evidence`` key is read back to decide: ``evidence`` is what the report shows.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ddp_doctor.diagnose.decision import Decision
from ddp_doctor.evidence import DdpParam, Site
from ddp_doctor.findings import Location, Severity, info


@dataclass
class Draft:
    """What a code family's module saw, in the order ``Finding`` takes it (code, what showed, fix, ...)."""

    code: str
    said: str                      # what showed where it showed: facts of the calls and lines, no "why"
    fix: str                       # the family's fix for ``code`` (an API's own fix, a case's)
    location: Location | None = None  # the line where it showed
    severity: Severity | str | None = None
    ranks: list[int] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)  # for the report; never read to decide
    title: str | None = None
    # -- facts the policy decides with ---------------------------------------------------------------
    unused: tuple[DdpParam, ...] = ()  # DDP's unused-parameter error: the parameters it named
    ddp_site: Site | None = None       # ... and the line that built the DDP model
    after_forward: bool = False        # a rank ran the training forward and no backward after it
    not_member: bool = False           # ranks passed a group they are not members of (torch skips the call)
    join_shadow: bool = False          # a collective of one's own inside a Join: its place is the decision
    chosen: tuple[str, int] | None = None  # the ranks passed different values as this (keyword, position) at
    chosen_by: tuple[tuple[int, tuple[tuple[str, str], ...]], ...] = ()  # ... a call up to the line where it
    #                                    showed: (rank, ((name, value),)) each, as the probe recorded it
    then: tuple[str, ...] = ()         # what happens next, from the stall policy (the job runs on; the proof)

    def __post_init__(self) -> None:
        self.severity = info(self.code).severity if self.severity is None else Severity(self.severity)


@dataclass(frozen=True)
class Ruling:
    """The policy's decision on a draft: the code, the culprit ranks, the fix and where the ranks parted."""

    code: str
    ranks: tuple[int, ...]
    fix: str
    decision: Decision | None = None
    recoded_from: str | None = None  # the code the showing implied, when the decision's kind changed it
    alone: tuple[int, ...] = ()      # ranks whose call is on a path the others do not take (said so)
