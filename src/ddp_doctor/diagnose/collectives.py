"""DDP201 (a collective only some ranks call), DDP202 (the DDP model run on a subset of ranks) and DDP203
(ranks disagree at one collective position): who is at fault and at which line."""
from __future__ import annotations

from dataclasses import dataclass

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.apis import api_fix
from ddp_doctor.evidence import GROUP_CREATION, Collective, JobEvidence, RankState, Site, Verdict
from ddp_doctor.evidence.ops import C10D_FILE, collective_frame, op_name
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose.calltext import differs_text
from ddp_doctor.diagnose.apiwords import api_of, api_parting, called, op_text, why_all
from ddp_doctor.diagnose.blame import (MORE_OFTEN, WENT_ALONE, Blame, agreement, blame_calls, ddp_subset_forwards,
                                      group_members, not_members_passed, thread_ran_on)
from ddp_doctor.diagnose.live import parted_calls
from ddp_doctor.diagnose.common import (FIX_101, FIX_201, FIX_202, FIX_203, lint_flagged, lint_line, loc, others_text, ranks_of,
                                        step_evidence, user_frame, where)
from ddp_doctor.diagnose.sizes import explain as explain_sizes
from ddp_doctor.diagnose.steps import uneven_steps

FIX_203_GROUP = runtime_fix("DDP203.group")
FIX_203_NOT_MEMBER = runtime_fix("DDP203.not_member")
# the evidence key of a DDP203 on ranks that passed a group they are not in (provenance reads it: one spelling)
NOT_MEMBER = "not_member"
# why ranks are blamed, when it is not that their calls differ (``PositionBlame.why``, decided once)
THREAD_EXTRA = "thread"  # their own thread made one call more than the others' (whose thread has ended)


def diagnose_ddp_subset(ev: JobEvidence) -> list[Draft]:
    """DDP202 from forward sites alone (for a failed job: a rank ran the DDP model where others never did)."""
    ranks = ranks_of(ev)
    subset, site = ddp_subset_forwards(ranks)
    if not subset:
        return []
    fwd = {str(r): st.forwards for r, st in ranks.items()}
    msg = (f"Rank {', '.join(map(str, subset))} called the DDP model at {where(site)}, where the other ranks never "
           f"did (DDP forward calls per rank: {fwd}). Each DDP forward may broadcast buffers (BatchNorm running "
           "stats) and prepares a gradient all-reduce, so these calls pair with the other ranks' unrelated "
           "collectives: a hang or silently mixed training follows.")
    return [Draft("DDP202", msg, FIX_202, location=loc(site), ranks=subset,
                  evidence={"forwards": fwd, **step_evidence(ranks)})]


def on_group(group: str | None, ranks: dict[int, RankState] | None = None) -> str:
    """A group in words: "world", or the subgroup's key with its ranks and, for a DeviceMesh's group, the
    dimension the ranks named it ("pg:0,1 (ranks 0, 1; mesh dimension 'tp')")."""
    members = group_members(group, [])
    if group in (None, "world", GROUP_CREATION) or not members:
        return group or "world"
    dims = sorted({st.mesh_dims[group] for st in (ranks or {}).values() if group in st.mesh_dims})
    dim = f"; mesh dimension {' / '.join(repr(x) for x in dims)}" if dims else ""
    return f"{group} (ranks {', '.join(map(str, members))}{dim})"


@dataclass(frozen=True)
class PositionBlame:
    """Whom to blame at one collective position of one group: the code, the ranks at fault and their line,
    every member's call there, and ``why`` when it is not that the calls differ (``THREAD_EXTRA``,
    ``NOT_MEMBER``): decided once here, worded by :func:`finding_for_calls`."""
    code: str
    ranks: list[int]
    site: Site | None
    calls: dict[int, Collective | None]
    group: str | None
    seq: int | str | None
    why: str | None = None
    blame: Blame | None = None  # the judge's answer, when its history says why (``Blame.why``)

    def finding(self, ranks: dict[int, RankState], detected_how: str) -> Draft:
        if self.blame is not None and self.blame.why is not None:
            return finding_for_blame(self.blame, self.calls, ranks, self.group, self.seq, detected_how)
        return finding_for_calls(self.code, self.ranks, self.site, self.calls, ranks, self.group, self.seq,
                                 detected_how, why=self.why)


def not_member_blame(calls: dict[int, Collective | None], ranks: dict[int, RankState]) -> PositionBlame | None:
    """DDP203 on members that passed a group they are not in (torch skipped their call) where the others wait."""
    passed, skipped = not_members_passed(calls, ranks)
    if not passed:
        return None
    return PositionBlame("DDP203", passed, skipped.site, dict(calls), skipped.group, skipped.seq, NOT_MEMBER)


def blame_positions(in_coll: dict[int, Collective], ranks: dict[int, RankState]) -> PositionBlame | None:
    """Ranks stuck in collectives of several groups or positions: whom to blame, at which position.

    Sequence numbers count per group, so each (group, seq) some rank waits at is judged only against the
    members of that group: the waiters' calls and wherever the group's other members are now (in another
    group's collective, or outside).  Waiters that are themselves at fault (DDP201/202: a line the other
    members never reach) are the answer, merged across groups when the same line is to blame in each."""
    world = sorted(ranks)
    positions: dict[tuple, list[int]] = {}
    for r, c in in_coll.items():
        positions.setdefault((c.group, c.seq), []).append(r)
    found: dict[tuple, list] = {}
    mismatch = extra = None
    for (g, s), waiters in sorted(positions.items(), key=lambda kv: (-len(kv[1]), str(kv[0]))):
        members = group_members(g, world)
        if members is None:
            continue
        calls = {r: in_coll[r] for r in waiters}
        absent = [m for m in members if m not in calls]
        if any(m not in ranks or ranks[m].missing or ranks[m].finished for m in absent):
            continue  # a member that is gone: the exit diagnosis speaks for it
        if not absent and len({agreement(c) for c in calls.values()}) == 1:
            continue  # every member is in it and they agree
        calls.update({a: in_coll.get(a) for a in absent})
        passed, skipped = not_members_passed(calls, ranks)
        if passed:  # members that passed a group they are not in at this very line: merged across groups
            site = skipped.site
            key = ("DDP203", site.key())
            found.setdefault(key, ["DDP203", [], site, {}, g, s, NOT_MEMBER])
            found[key][1] = sorted(set(found[key][1]) | set(passed))
            found[key][3].update(calls)
            continue
        ran_on = [r for r in thread_ran_on(calls, ranks) if r in waiters]
        if ran_on and extra is None:  # a thread that made one call more: what the others' calls wait for
            extra = PositionBlame("DDP201", ran_on, calls[ran_on[0]].site, calls, g, s, THREAD_EXTRA)
            continue
        b = blame_calls(calls, ranks=ranks)
        code, fault, site = b.unpack()
        if b.why is not None and set(fault) <= set(waiters) and extra is None:  # the history says why: as it is
            extra = PositionBlame(code, fault, site, calls, g, s, blame=b)
            continue
        if code in ("DDP201", "DDP202") and set(fault) <= set(waiters):
            key = (code, site.key() if site else None)
            if key not in found:
                found[key] = [code, [], site, {}, g, s, None]
            found[key][1] = sorted(set(found[key][1]) | set(fault))
            found[key][3].update(calls)
        elif not absent and mismatch is None:
            mismatch = PositionBlame(code, fault, site, calls, g, s)
    if extra is not None:
        return extra
    if found:
        return PositionBlame(*max(found.values(), key=lambda f: len(f[1])))
    return mismatch


def _call_text(c: Collective, group, seq, tensors: bool = True) -> str:
    pos = "" if c.group == group else f" ({'' if c.seq is None else f'#{c.seq} '}on {c.group})"
    args = "(" + ", ".join(c.shapes) + ")" if c.shapes and tensors else ""
    return f"{op_text(c, args)}{pos} at {where(c.site)}"


def finding_for_calls(code: str, at_fault: list[int], site, calls, ranks, group, seq, detected_how: str,
                      why: str | None = None) -> Draft:
    fault = set(at_fault)
    calls_txt = "; ".join(f"rank {r}: {_call_text(c, group, seq)}" for r, c in sorted(calls.items()) if c)
    rs = ", ".join(map(str, sorted(fault)))
    own = sorted({calls[r].group for r in fault if calls.get(r)} - {None, "world", GROUP_CREATION})
    if own:  # a subgroup's collective: "the other ranks" are the group's other members
        on = f" on {' and '.join(on_group(g, ranks) for g in own)}"
        never = f"a line the other ranks of {'that group' if len(own) == 1 else 'those groups'} have not reached"
    else:
        on, never = "", "a line the other ranks have not reached"
    if code == "DDP201" and why == THREAD_EXTRA:
        c = calls[at_fault[0]]
        msg = (f"Rank {rs}'s own thread {called(c, site)}{on} once more than the other ranks' did: their thread "
               f"that makes this call ({c.site.function}) has ended, so it has no partner; "
               f"{others_text(ranks, fault)}. {detected_how} (collective #{seq} on {group}: {calls_txt}).")
        fix = FIX_201
    elif code == "DDP201":
        msg = (f"Rank {rs} {called(calls[at_fault[0]], site)}{on}, {never}; "
               f"{others_text(ranks, fault)}.{why_all(calls[at_fault[0]])} {detected_how} "
               f"(collective #{seq} on {group}: {calls_txt}).")
        fix = api_fix(api_of(calls[at_fault[0]])) or FIX_201
    elif code == "DDP202":
        msg = (f"Rank {rs} ran the DDP model at {where(site)}{on}, where the other ranks have not run it: its DDP "
               f"{'buffer broadcast' if 'forward' in calls[at_fault[0]].op else 'gradient all-reduce'} "
               f"pairs with the others' unrelated collectives; {others_text(ranks, fault)}. {detected_how} "
               f"(collective #{seq} on {group}: {calls_txt}).")
        fix = FIX_202
    elif code == "DDP203" and why == NOT_MEMBER:
        waiting = "; ".join(f"rank {r} waits in {c.op} on {on_group(c.group, ranks)}"
                            for r, c in sorted(calls.items()) if c and r not in fault and not c.op.startswith("ddp."))
        op = next(c.op for c in calls.values() if c and not c.op.startswith("ddp."))
        msg = (f"Rank {rs} called {op}() at {where(site)} with a process group {'it is not a member' if len(fault) == 1 else 'they are not members'} "
               f"of: torch skips such a call with only a warning, so {'it' if len(fault) == 1 else 'they'} "
               f"went on while the group's members wait for {'it' if len(fault) == 1 else 'them'} ({waiting}); "
               f"{others_text(ranks, set(calls) - fault)}. {detected_how}.")
        fix = FIX_203_NOT_MEMBER
    elif group == GROUP_CREATION:
        msg = (f"At process-group creation #{seq} the ranks disagree: {calls_txt}. Every rank must call "
               "new_group (and new_subgroups / init_device_mesh, which call it) in the same order with the same "
               "arguments: torch names a group by how many were created before it, so these ranks mean "
               "different groups by one name; its members wait in its set-up for ranks that never join, or "
               f"later collectives pair across the wrong groups. {detected_how}.")
        fix = FIX_203_GROUP
    else:
        sized = explain_sizes(calls, len(ranks))
        differs = (sized.text or differs_text(calls)) if sized else differs_text(calls)
        if differs:  # the tensors are spelled out there, rank by rank
            calls_txt = "; ".join(f"rank {r}: {_call_text(c, group, seq, tensors=False)}"
                                  for r, c in sorted(calls.items()) if c)
        msg = (f"At collective #{seq} on {on_group(group, ranks)} the ranks disagree: {calls_txt}.{differs} gloo/NCCL pair "
               f"calls by position only, so this hangs, crashes or silently mixes data. {detected_how}.")
        fix = sized.fix if sized else FIX_203
    ev = {"group": group, "seq": seq, "calls": {str(r): c for r, c in calls.items() if c}, **step_evidence(ranks)}
    if fix is FIX_203_NOT_MEMBER:
        ev[NOT_MEMBER] = sorted(fault)
    return Draft(code, msg, fix, location=loc(site), ranks=sorted(fault), evidence=ev,
                 not_member=fix is FIX_203_NOT_MEMBER)


def _left_loop_early(ranks, calls, fault, site, lint, group, seq) -> Draft | None:
    """DDP101, not DDP201, when the ranks "calling alone" are in an earlier epoch than the others.

    A collective after the training loop (a final barrier, a metric all_reduce) reached by a rank that
    broke out early (local early stopping) pairs with the others' gradient all-reduces: the collective is
    reached by every rank in the code, the cause is the rank-local exit from the loop.
    """
    eps = {r: c.epoch for r, c in calls.items() if c}
    others = [r for r in eps if r not in fault]
    if not others or any(e is None for e in eps.values()):
        return None
    last, now = max(eps[r] for r in fault), min(eps[o] for o in others)
    if last >= now:
        return None
    # At this instant a rank that left the loop looks like one that has not begun the next epoch yet (an
    # epoch-end barrier under `if rank == 0`): the script decides. Only when lint located a rank-local exit
    # from the loop, and did not flag this collective itself as rank-conditional, is it DDP101.
    location = lint_line(lint, "DDP101", site, site.path if site else None)
    flagged_here = site is not None and lint_flagged(lint, "DDP201", site)
    if location is None or flagged_here:
        return None
    rs, os_ = ", ".join(map(str, fault)), ", ".join(map(str, others))
    op = calls[fault[0]].op
    their = "; ".join(f"rank {o}: {calls[o].op} at {where(calls[o].site)}" for o in others)
    msg = (f"Rank {rs} left the training loop in epoch {last} while rank {os_} went on training (epoch {now}): "
           f"rank {rs}'s {op}() at {where(site)} paired with the others' training collectives ({their}; "
           f"collective #{seq} on {group}). DDP all-reduces gradients every step, so a rank-local early stop or "
           "`break` leaves the others waiting, or averaging gradients with an unrelated call, until the job hangs "
           "or crashes. Detected as it happened, before any timeout.")
    msg += " The line shown is where ddp-doctor lint located the rank-local exit from the loop."
    return Draft("DDP101", msg, FIX_101, location=loc(location), ranks=sorted(fault),
                 evidence={"group": group, "seq": seq, "calls": {str(r): c for r, c in calls.items()},
                           "epoch_at_collective": {str(r): e for r, e in eps.items()}, **step_evidence(ranks)})


def diagnose_desync(ev: JobEvidence, d: Verdict) -> list[Draft]:
    ranks = ranks_of(ev)
    lint = ev.lint
    calls = dict(d.calls)
    if d.kind == "cycle":  # ranks blocked in different groups, waiting for each other: judge every group
        blocked = {r: st.in_collective for r, st in ranks.items() if st.in_collective and not st.failed}
        b = blame_positions({**blocked, **calls}, ranks)
        if b:
            return [b.finding(ranks, "Detected as it happened, before any timeout: the ranks wait for each other "
                                     "in collectives of different groups")]
    shown = "; ".join(f"rank {r}: {_call_text(c, d.group, d.seq)}" for r, c in sorted(calls.items()))
    showed = f"it showed as a mismatch at collective #{d.seq} on {on_group(d.group, ranks)} ({shown})"
    first = parted_first(ranks, showed, lint, dict(d.parted))
    if first is not None:
        for k, v in {"group": d.group, "seq": d.seq, "calls": {str(r): c for r, c in calls.items()}}.items():
            first.evidence.setdefault(k, v)
        return [first]
    b = blame_calls(calls, lint, ranks=ranks)
    if b.code == "DDP201" and b.why is None:
        early = _left_loop_early(ranks, calls, list(b.ranks), b.site, lint, d.group, d.seq)
        if early:
            return [early]
    return [finding_for_blame(b, calls, ranks, d.group, d.seq, "Detected as it happened, before any timeout")]


def parted_first(ranks: dict[int, RankState], showed: str, lint, parted: dict[int, Collective] | None = None
                 ) -> Draft | None:
    """Where the ranks parted before the divergence showed, told before what it showed as -- one order for each
    way it shows in ``run`` (a mismatch, gloo's abort, a rank that finished while the others wait): ranks that
    alone entered an API at a line no other rank ran (DDP201), then the first position where the ranks' calls
    parted (``from_parted``: DDP202, DDP101; ``parted``: that position's calls, by default the first of all
    the ranks' fingerprints).  ``showed``: how the divergence showed (kept in the message)."""
    api = _api_parted(ranks, showed)
    if api is not None:
        return api
    if parted is None:
        parted = parted_calls({r: {(c.group, c.seq): c for c in st.fingerprints} for r, st in ranks.items()})
    return from_parted(ranks, parted, showed, lint)


def finding_for_blame(b: Blame, calls, ranks, group, seq, detected_how: str) -> Draft:
    """The judge's answer (``blame_calls``) in words, with the calls at the position it showed at."""
    if b.why == WENT_ALONE:
        return _went_alone_finding(list(b.ranks), b.alone, calls, ranks, group, seq, detected_how)
    if b.why == MORE_OFTEN:
        return _ran_longer(list(b.ranks), b.counts, calls, ranks, group, seq, detected_how)
    return finding_for_calls(b.code, list(b.ranks), b.site, calls, ranks, group, seq, detected_how)


def _went_alone_finding(fault: list[int], sc, calls, ranks, group, seq, detected_how: str) -> Draft:
    """DDP201 for ranks that entered an API at a line inside a branch on the rank the others never ran."""
    c = Collective(group, None, sc.op, site=sc.site)
    calls_txt = "; ".join(f"rank {r}: {_call_text(x, group, seq)}" for r, x in sorted(calls.items()) if x)
    msg = (f"Rank {', '.join(map(str, fault))} {called(c, sc.site)} ({sc.calls} {sc.op} call"
           f"{'s' * (sc.calls != 1)} there), a line inside a branch on the rank that the other ranks never ran: its "
           f"collectives paired with the others' unrelated ones; {others_text(ranks, set(fault))}.{why_all(c)} "
           f"{detected_how}; it showed at collective #{seq} on {group} ({calls_txt}).")
    ev = {"group": group, "seq": seq, "calls": {str(r): x for r, x in calls.items() if x},
          "alone_at": {"site": sc.site, "op": sc.op, "calls": sc.calls}, **step_evidence(ranks)}
    return Draft("DDP201", msg, api_fix(api_of(c)) or FIX_201, location=loc(sc.site), ranks=list(fault),
                 evidence=ev)


def _ran_longer(fault: list[int], counts: str, calls, ranks, group, seq, detected_how: str) -> Draft:
    """DDP201 for ranks that entered an API once more than the others at a line every rank runs."""
    c = calls[fault[0]]
    calls_txt = "; ".join(f"rank {r}: {_call_text(x, group, seq)}" for r, x in sorted(calls.items()) if x)
    msg = (f"Rank {', '.join(map(str, fault))} {called(c, c.site)} more often than the other ranks ({counts}): a "
           f"loop that runs a different number of times per rank (micro-batches of each rank's own data); "
           f"{others_text(ranks, set(fault))}.{why_all(c)} {detected_how} "
           f"(collective #{seq} on {group}: {calls_txt}).")
    ev = {"group": group, "seq": seq, "calls": {str(r): x for r, x in calls.items() if x}, **step_evidence(ranks)}
    return Draft("DDP201", msg, runtime_fix("DDP201.count"), location=loc(c.site), ranks=fault, evidence=ev)


def _api_parted(ranks: dict[int, RankState], showed: str) -> Draft | None:
    """DDP201 where some ranks alone entered an API (``apiwords.api_parting``), with how it showed later."""
    found = api_parting(ranks)
    if found is None:
        return None
    fault, calls = found
    first = calls[fault[0]]
    return finding_for_calls("DDP201", fault, first.site, calls, ranks, first.group, first.seq,
                             f"The ranks parted there; {showed}")


def from_parted(ranks: dict[int, RankState], parted: dict[int, Collective], showed: str, lint) -> Draft | None:
    """The finding told from where the ranks parted before the divergence showed (``live.parted_calls``): the
    DDP model run at a line the others never ran it at (DDP202), or calls paired across different training
    steps (DDP101: the rank that skipped).  ``showed``: how the divergence showed (kept in the message)."""
    if len(parted) < 2:
        return None
    first = next(iter(parted.values()))
    if first.op.startswith("ddp.") and all(c.site for c in parted.values()) \
            and len({c.site.key() for c in parted.values()}) > 1:
        code, fault, site = blame_calls(parted, ranks=ranks).unpack()
        if code == "DDP202":
            return finding_for_calls(code, fault, site, parted, ranks, first.group, first.seq,
                                     f"The ranks parted there; {showed}")
    labels = {r: (c.epoch, c.step_in_epoch) for r, c in parted.items()}
    if len({e for e, _ in labels.values()}) < 2 or any(e is None for e, _ in labels.values()):
        return None
    behind = sorted(parted, key=lambda r: labels[r])
    site = parted[behind[0]].site
    txt = "; ".join(f"rank {r} in epoch {e} after {s} steps" for r, (e, s) in sorted(labels.items()))
    how = (f"collective #{first.seq} on {first.group} ({parted[behind[0]].op} at {where(site)}) paired different "
           f"training steps: {txt}; {showed}")
    ahead = max(labels.values())  # the rank(s) already in a later epoch ran fewer steps in the earlier one
    fewer = sorted(r for r, e in labels.items() if e == ahead)
    epoch = min(e for e, _ in labels.values())
    steps = {r: st.steps_by_epoch[epoch] if len(st.steps_by_epoch) > epoch else 0 for r, st in ranks.items()}
    f = uneven_steps(ranks, epoch, steps, how, lint=lint, fallback=fewer, near=site)
    f.evidence["parted_at"] = {"group": first.group, "seq": first.seq,
                               "calls": {str(r): c for r, c in parted.items()}}
    return f


def fatal_call(st: RankState) -> Collective | None:
    """{op, site} of the collective a rank was inside when a fatal signal (gloo abort) killed it: the one
    ``evidence.ops.collective_frame`` names (the call the user made, as the probe records it)."""
    if st.signal not in ("SIGABRT", "SIGSEGV", "SIGBUS"):
        return None
    known = st.in_collective  # posted before the call when it was the first at its line (shapes, dtypes)
    if known is not None and known.blocking and not st.stack:
        return known  # no stack was dumped (a SIGSEGV can end it first): it was inside this call at its last post
    site = user_frame(st.stack)
    if known and any(f.path.endswith(C10D_FILE) and op_name(f.function) == known.op for f in st.stack) \
            and (not known.site or not site or known.site.key() == site.key()):
        return known
    inside = collective_frame(st.stack)
    return None if inside is None else Collective("world", None, inside[0], site=site)


def diagnose_fatal_collective(ev: JobEvidence) -> list[Draft]:
    """A rank aborted inside a collective (gloo EnforceNotMet on a mismatch): compare with where the others were."""
    ranks = ranks_of(ev)
    calls = {}
    fatal = [c for c in (fatal_call(st) for st in ranks.values()) if c]
    fatal_ops = {c.op for c in fatal}
    pos = next(((c.group, c.seq) for c in fatal if c.seq is not None), None)
    for r, st in ranks.items():
        # a peer gloo let through the mismatched call is judged by its call at that position, not a later one
        at = next((f for f in st.fingerprints if (f.group, f.seq) == pos), None) if pos else None
        c = fatal_call(st) or at or st.in_collective or (st.exc.collective if st.exc else None)
        if not c and st.last_collective and st.last_collective.op in fatal_ops:
            c = st.last_collective  # it got through the same call (gloo paired it), then failed on the result
        if c:
            calls[r] = c
    if not fatal_ops or len(calls) < 2:
        return []
    first = parted_first(ranks, "it showed when gloo aborted the process (SIGABRT) on a later mismatch", ev.lint)
    if first is not None:
        return [first]
    seqs = {(c.group, c.seq) for c in calls.values() if c.seq is not None}
    group, seq = seqs.pop() if len(seqs) == 1 else ("world", "?")
    return [finding_for_blame(blame_calls(calls, ranks=ranks), calls, ranks, group, seq,
                              "gloo aborted the process (SIGABRT) on the mismatch")]
