"""The one policy on a runtime draft: where its ranks parted (the decision), the code that decision's kind
implies and the culprit ranks -- decided once, from recorded facts and the draft's typed facts, before a
word is written (``wording.word``)."""
from __future__ import annotations

import os

from ddp_doctor.diagnose.common import FIX_101
from ddp_doctor.diagnose.decision import Decision, user_stack
from ddp_doctor.diagnose.draft import Draft, Ruling
from ddp_doctor.diagnose.grad_sync import sync_choice
from ddp_doctor.diagnose.provenance import explain_at, group_choice, locate, thread_loop, value_choice
from ddp_doctor.diagnose.rankbranch import branch_in, caller_branch
from ddp_doctor.diagnose.stepexit import skipped_syncs, sync_skip_exit
from ddp_doctor.diagnose.unused import unused_branch
from ddp_doctor.evidence import RankState, Site
from ddp_doctor.findings import STEP_FAMILY, runtime_fix


def rule(d: Draft, ranks: dict[int, RankState]) -> Ruling:
    """The ruling on draft ``d``: its decision when one is found, and the code and culprits it implies."""
    decision = _decision_for(d, ranks)
    if decision is None:
        return Ruling(d.code, tuple(d.ranks), d.fix)
    if decision.parting in ("skip", "loop") and decision.culprits and d.code in ("DDP201", "DDP203", "DDP101"):
        # ranks that skipped a training step the others ran, or left a training loop the others stayed in
        if d.code == "DDP101" and sorted(decision.culprits) == sorted(d.ranks):
            return Ruling(d.code, tuple(d.ranks), d.fix, decision)
        return Ruling("DDP101", tuple(sorted(decision.culprits)), FIX_101, decision, recoded_from=d.code)
    if d.code == "DDP203" and decision.alone and not d.not_member:
        # not two calls that disagree as torch sees them: a collective only the ranks that went that way make
        return Ruling("DDP201", tuple(decision.alone), runtime_fix("DDP201"), decision, recoded_from=d.code,
                      alone=decision.alone)
    return Ruling(d.code, tuple(d.ranks), d.fix, decision)


def _decision_for(d: Draft, ranks: dict[int, RankState]) -> Decision | None:
    """Where the ranks of draft ``d`` parted, from the most certain facts first: the ranks' own no_sync()
    choices and skipped gradient syncs (counted by the probe), then where each rank stands now, then the line
    lint located, then the line the finding shows."""
    finished = d.code == "DDP204" and d.ranks and all(r in ranks and ranks[r].finished for r in d.ranks)
    aborted = d.code == "DDP204" and d.ranks and all(r in ranks and ranks[r].signal == "SIGABRT" for r in d.ranks)
    if aborted:  # gloo aborted on a gradient sync the ranks' own no_sync() choices put out of step
        return sync_choice(ranks)
    if d.code == "DDP204" and d.unused:
        return unused_branch(d.ddp_site, list(d.unused), list(d.ranks), ranks)
    if not d.ranks or not (d.code in STEP_FAMILY or finished) or d.join_shadow:
        return None  # (a collective of one's own inside a Join: its place is the decision, diagnose/joined.py)
    at = Site(d.location.path, d.location.line, d.location.function) if d.location else None
    if d.not_member and at is not None:
        return group_choice(at, d.ranks, ranks)
    if d.chosen is not None and at is not None:  # the assignment of the value the ranks passed differently
        keyword, position = d.chosen
        ways = tuple((r, f"passed {keyword}={dict(kv)[keyword]}") for r, kv in d.chosen_by)
        return value_choice(at, (keyword,), position, list(d.ranks), ranks, ways)
    if (found := sync_choice(ranks)) is not None:
        return found  # the ranks left DDP's no_sync() after different micro-batches
    if not finished and (skipped := skipped_syncs(ranks)) and (found := sync_skip_exit(skipped, ranks)) is not None:
        return found  # a rank ran the training forward and no backward after it: where it left that step
    found = locate(d.ranks, ranks) if not finished else None
    if found is None and at is not None and not finished:
        found = explain_at(at, d.ranks, ranks)
    if found is None and d.after_forward:
        found = sync_skip_exit(list(d.ranks), ranks)  # the probe saw the forward its backward never followed
    if found is None and at is not None and not finished:
        found = thread_loop(at, list(d.ranks), ranks)
    if found is None and at is not None and d.code != "DDP203":
        # the others are gone or elsewhere: the rank branch that holds the line the finding shows,
        # taken by the ranks standing at that line
        inside = [r for r, st in sorted(ranks.items())
                  if any(fr.line == at.line and os.path.basename(fr.path) == os.path.basename(at.path)
                         for fr in user_stack(st))] or ([] if finished else list(d.ranks))
        if inside and len(inside) < len(ranks):
            # the outermost rank branch on the way to that line: the callers' frames first, then the line's
            frames = [fr for fr in user_stack(ranks[inside[0]]) if (fr.path, fr.line) != (at.path, at.line)]
            found = branch_in(frames + [at], inside, ranks)
        if found is None and not finished:
            found = caller_branch(at, list(d.ranks), ranks)
    return found
