"""DDP204 (a rank crashed, was killed or finished while others wait: the root cause first) and DDP501
(restarted ranks cannot connect through torch's stale shared rendezvous store)."""
from __future__ import annotations

import re

from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.evidence import ExitStatus, JobEvidence, RankState, Site, Verdict
from ddp_doctor.evidence.torch_errors import collective_timed_out
from ddp_doctor.findings import runtime_fix

from ddp_doctor.diagnose import errors
from ddp_doctor.diagnose.apiwords import op_text
from ddp_doctor.diagnose.collectives import fatal_call, parted_first
from ddp_doctor.diagnose.provenance import exited_inside_loop
from ddp_doctor.diagnose.source import parse_file
from ddp_doctor.diagnose.common import (FIX_101, doing, gist, lint_line, loc, others_text, rank_site, ranks_of,
                                        step_evidence, user_frame, where)
from ddp_doctor.diagnose.pipeline import in_schedule, microbatch_split
from ddp_doctor.diagnose.steps import uneven_steps


def _root_ranks(ranks: dict[int, RankState]) -> list[int]:
    """The rank(s) whose exit caused the others': an exception outside a collective, then a killing signal,
    then an exception inside a collective (the first one), then a non-zero exit; a broken connection (a
    peer's end, whenever it was recorded) only where no rank ended otherwise."""
    broken = {r for r, st in ranks.items() if st.exc and _consequence(st)}
    exc = {r: st.exc for r, st in ranks.items() if st.exc and r not in broken}
    own = sorted((r for r, e in exc.items() if not e.collective),
                 key=lambda r: exc[r].t or 0)
    if own:
        first = exc[own[0]]

        def key(e):
            return (e.type, e.location.line if e.location else None)
        return [r for r in own if key(exc[r]) == key(first)]
    sig = [r for r, st in ranks.items() if st.exit and st.exit.killed]
    if sig:
        return sorted(sig)
    if exc:
        return sorted(exc, key=lambda r: exc[r].t or 0)[:1]
    bad = [r for r, st in ranks.items() if r not in broken and st.exit and st.exit.exit_code not in (None, 0, -15)]
    if bad:
        return sorted(bad)
    if broken:
        return sorted(broken, key=lambda r: ranks[r].exc.t or 0)[:1]
    return sorted(r for r, st in ranks.items() if st.signal)


def timeouts_as_waits(ranks: dict[int, RankState]) -> dict[int, RankState]:
    """Ranks whose only failure is a collective that timed out (``monitored_barrier``, a short process-group
    timeout), as the waiting ranks they were -- when some other rank is alive and was not in that collective.
    The timeout is the consequence; the cause is the rank it waited for (a dead thread, a stuck read)."""
    failed = {r: st for r, st in ranks.items() if st.failed}
    if not failed:
        return {}
    waits, timed_out = {}, False
    for r, st in failed.items():
        e = st.exc
        if e is None or e.collective is None or (st.exit is not None and st.exit.killed):
            return {}
        if collective_timed_out(e.message):
            timed_out = True
        elif not _consequence(st):
            # (a broken connection in a collective is the timed-out peer's end: monitored_barrier's rank 0
            # raises on its timeout, and the ranks that passed the barrier lose their connection to it)
            return {}
        waits[r] = st.with_(exc=None, exit=None, done=False, in_collective=e.collective)
    if not timed_out:
        return {}
    pos = {(c.in_collective.group, c.in_collective.seq) for c in waits.values()}
    apart = [r for r, st in ranks.items() if r not in failed and not st.missing and not st.done
             and (st.in_collective is None or (st.in_collective.group, st.in_collective.seq) not in pos)]
    return waits if apart else {}


def _finished_with_the_others(r: int, ranks: dict[int, RankState]) -> bool:
    """Every other rank ended normally and rank ``r`` had run as many steps as they did: whatever killed it
    came after the training (freeing the DDP model as its main function returned, say)."""
    others = [st for o, st in ranks.items() if o != r and not st.missing]
    return bool(others) and all(st.finished for st in others) and ranks[r].step >= max(st.step for st in others) > 0


def finished_early(ranks: dict[int, RankState]) -> list[int]:
    """Ranks that ended normally while another was still inside a collective (or failed in one after)."""
    done = [r for r, st in ranks.items() if st.finished]
    stuck = [r for r, st in ranks.items() if r not in done and (
        st.in_collective or (st.exc and st.exc.collective))]
    return sorted(done) if done and stuck else []


def finished_case(ranks: dict[int, RankState], d: Verdict | None) -> bool:
    """A rank ended (normally or by sys.exit) while others waited for it, and nothing else failed first.
    Only ranks in ``ranks`` count: the ranks of a lost node, taken out as its consequence, may be the ones
    the live verdict saw finish."""
    if not any(st.finished for st in ranks.values()):
        return False
    if d is not None and d.finished:
        return True
    if not finished_early(ranks):
        return False
    for st in ranks.values():
        if st.exc and not st.exc.collective:
            return False  # a rank raised on its own: that is the story
        if st.exit and st.exit.killed:
            return False  # a rank was killed
    return True


_CONNECT_WORDS = ("connectfullmesh", "connection refused", "failed to connect", "timed out connecting",
                  "connect timeout", "socket timeout", "connection reset")


def diagnose_restart_connect(ev: JobEvidence) -> Draft | None:
    """Ranks restarted by torch's agent fail to connect their process group: the stale rendezvous store.

    With ``TORCHELASTIC_USE_AGENT_STORE`` the ranks' process-group keys live in the agent's TCPStore,
    which outlives an attempt; a restarted rank can read a peer's address from the failed attempt and
    connect to a dead port (gloo connectFullMesh / NCCL "connection refused"), so every restart fails.
    When it applies it is the whole story of a failed or hung attempt.
    """
    ranks = ranks_of(ev)
    def in_init(frames):
        return any(f.function in ("init_process_group", "new_group", "_new_process_group_helper")
                   for f in frames or ())

    failed, stuck = [], []
    for r, st in ranks.items():
        if not (st.attempt and st.agent_store):
            continue
        e = st.exc
        if e and in_init(e.traceback) and any(w in (e.message or "").lower() for w in _CONNECT_WORDS):
            failed.append(r)
        elif not e and not st.exit and in_init(st.stack):
            stuck.append(r)  # still connecting (to a stale address whose port something else now holds)
    hit = failed or stuck
    if not hit:
        return None
    st0 = ranks[hit[0]]
    attempt = st0.attempt
    e = st0.exc
    site = e.location if e else user_frame(st0.stack)
    what = (f"failed to connect the process group at {where(site)}: {e.type}: {gist(e.message, 200)}"
            if e else f"never finished connecting the process group at {where(site)}.")
    msg = (f"torch's agent restarted the job (attempt {attempt}) and rank{'s' if len(hit) > 1 else ''} "
           f"{', '.join(map(str, hit))} then {what} The restarted ranks share the launcher's rendezvous store "
           "(TORCHELASTIC_USE_AGENT_STORE=True), which still holds the failed attempt's connection keys: a rank "
           "can read a dead peer's address and connect to nothing (a known torch issue, pytorch/pytorch#135712). "
           "Every restart can fail this way, so --max-restarts does not help.")
    fix = runtime_fix("DDP501.stale-store")
    return Draft("DDP501", msg, fix, location=loc(site), ranks=hit,
                 evidence={"attempt": attempt, "agent_store": True, **({"exception": e} if e else {})})


_CONSEQUENCE_WORDS = ("connection reset", "connection closed", "connection refused", "broken pipe",
                      "socket timeout", "timed out")


def diagnose_lost_nodes(ev: JobEvidence) -> list[Draft]:
    """Several nodes: a node's ``ddp-doctor run`` went silent and never answered (killed, out of memory, the
    node lost).  Its ranks die with their launcher, so the other ranks' connection errors follow from it."""
    out = []
    ranks = ranks_of(ev)
    for n in ev.lost_nodes:
        others = sorted(r for r, st in ranks.items() if r not in n.ranks and st.exc is not None)
        then = "; ".join(f"rank {r} raised {ranks[r].exc.type}: {gist(ranks[r].exc.message, 120)}" for r in others[:4])
        msg = (f"The ddp-doctor launcher of node {n.node} (host {n.host}, ranks {', '.join(map(str, n.ranks))}) went "
               f"silent ({n.silent_s:g}s without a summary) and did not answer: it ended (killed, out of memory, the "
               "node lost) and its ranks ended with it (ranks die with their launcher), unwatched from then on."
               + (f" The other ranks then failed: {then}." if then else ""))
        out.append(Draft("DDP204", msg, runtime_fix("DDP204.node-lost"), ranks=list(n.ranks),
                         evidence={"lost_node": n.to_json(), **step_evidence(ranks)}))
    return out


def beyond_lost_nodes(ev: JobEvidence, ranks: dict[int, RankState]) -> dict[int, RankState]:
    """The ranks whose story is their own: not on a node whose launcher went silent, and not failing on the
    broken connection that loss caused."""
    lost = {r for n in ev.lost_nodes for r in n.ranks}
    if not lost:
        return ranks
    return {r: st for r, st in ranks.items() if r not in lost and not _consequence(st)}


def _consequence(st: RankState) -> bool:
    """A rank's exception reads as a lost peer's consequence (a broken connection) -- unless the rank's own
    DataLoader worker died (the connection that broke was the worker's queue: the rank's own failure)."""
    msg = (st.exc.message or "").lower() if st.exc else ""
    return any(w in msg for w in _CONSEQUENCE_WORDS) and not any(ld.worker_exits for ld in st.loaders)


def _alone_after(waiting: dict[int, RankState], done: list[RankState]) -> list[int]:
    """Waiting ranks in a collective of their own (not DDP's) at a line no finished rank ever reached: with the
    same step counts, not a rank that left training early but ranks that went on alone (an evaluation on
    the main process only)."""
    seen = {k for st in done for k in st.lines_seen()}
    return sorted(r for r, st in waiting.items() if (c := _waited_in(st)) and c.site
                  and not c.op.startswith("ddp.") and c.site.key() not in seen)


def _waited_in(st: RankState):
    """The collective a rank waits in, or failed in (a broken connection when the peer ended)."""
    return st.in_collective or (st.exc.collective if st.exc else None)


def _went_on_alone(alone: list[int], done: list[int], ranks: dict[int, RankState]) -> Draft:
    c = _waited_in(ranks[alone[0]])
    rs, ds = ", ".join(map(str, alone)), ", ".join(map(str, done))
    msg = (f"Rank {rs} went on alone into {c.op}() at {where(c.site)}, a line rank {ds} never reached before it "
           f"finished the same {ranks[done[0]].step} training steps: {others_text(ranks, set(done))}. A collective "
           "after training that only some ranks make (an evaluation, a save, a metric gather on the main process) "
           "has no partner.")
    return Draft("DDP201", msg, runtime_fix("DDP201"), location=loc(c.site), ranks=alone,
                 evidence={"finished": done, **step_evidence(ranks)})


def diagnose_exit(ev: JobEvidence, d: Verdict) -> list[Draft]:
    """DDP204 and what led to it: the lost nodes first (the others' broken connections follow from them), then
    a rank that ended while the others waited for it (:func:`_finished`), else the ranks that failed
    (:func:`_failed`)."""
    ranks = ranks_of(ev)
    out: list[Draft] = diagnose_lost_nodes(ev)
    if out:  # the lost nodes are the story; the others' broken connections follow from them
        ranks = beyond_lost_nodes(ev, ranks)
        if not any(st.failed for st in ranks.values()):
            return out
    if finished_case(ranks, d):
        return out + _finished(ranks, ev.lint)
    out += _failed(ranks)
    if not out and not ev.lost_nodes:
        out.append(Draft("DDP204", "A rank exited while the others were running (no detail was captured).",
                         runtime_fix("DDP204.unknown"), ranks=[], evidence=step_evidence(ranks)))
    return out


def _finished(ranks: dict[int, RankState], lint) -> list[Draft]:
    """A rank ended while the others wait for it: why it ended early (:func:`_why_finished`), then DDP204 on it."""
    done = sorted(r for r, st in ranks.items() if st.finished)
    waiting = {r: st for r, st in ranks.items() if r not in done}
    steps = {r: st.step for r, st in ranks.items()}
    why = _why_finished(ranks, done, waiting, lint)
    site = next((s for s in (rank_site(st) for st in waiting.values()) if s), None)
    exit_site = next((ranks[r].exit_site for r in done if ranks[r].exit_site), None)
    if exit_site:
        site = exit_site
    msg = (f"Rank {', '.join(map(str, done))} " + (f"{_exit_words(exit_site)} at {where(exit_site)}" if exit_site
                                                    else "finished") +
           f" while the others still wait: {others_text(ranks, set(done))}.")
    ended = Draft("DDP204", msg, FIX_101 if len(set(steps.values())) > 1 else runtime_fix("DDP204.finished"),
                  location=loc(site), ranks=done,
                  evidence={"finished": done, "waiting": {str(r): doing(st) for r, st in waiting.items()},
                            **step_evidence(ranks)})
    return [*([why] if why is not None else []), ended]


# a call of exit()/quit() as the builtins, not a method or a name that ends so (``trainer.should_exit()``)
_EXIT_WORDS = ((re.compile(r"\bsys\.exit\("), "called sys.exit()"), (re.compile(r"\braise\s+SystemExit\b"), "raised SystemExit"),
               (re.compile(r"(?<![\w.])quit\("), "called quit()"), (re.compile(r"(?<![\w.])exit\("), "called exit()"))


def _exit_words(site: Site) -> str:
    """How the program ended at ``site`` (a SystemExit), as its line says: "called sys.exit()", "raised
    SystemExit", "called exit()"."""
    parsed = parse_file(site.path)
    text = parsed[1][site.line - 1] if parsed and 0 < site.line <= len(parsed[1]) else ""
    for word, said in _EXIT_WORDS:
        if word.search(text):
            return said
    return "ended its program (SystemExit)"


def _why_finished(ranks: dict[int, RankState], done: list[int], waiting: dict[int, RankState],
                  lint) -> Draft | None:
    """Why a rank finished while the others wait: where the ranks parted before (``parted_first``), ranks that
    went on alone after the same steps, a rank that left the loop (DDP101), or step counts that differ."""
    steps = {r: st.step for r, st in ranks.items()}
    parted = parted_first(ranks, f"it showed when rank {', '.join(map(str, done))} finished while the others "
                                 "waited for it", lint)
    if parted is not None:  # where the ranks parted, not where it showed
        return parted
    if len(set(steps.values())) <= 1:
        if alone := _alone_after(waiting, [ranks[r] for r in done]):
            return _went_on_alone(alone, done, ranks)
        if not waiting or any(ranks[r].step == 0 for r in done) \
                or all(exited_inside_loop(ranks[r], list(waiting.values())) for r in done):
            # it made no training step (it never was in a training loop), or it called sys.exit() inside the loop
            # the others train in: it left no training loop; the DDP204 beside this says where it ended
            return None
        msg = (f"Rank {', '.join(map(str, done))} left the training loop and finished after "
               f"{steps[done[0]]} steps while the others still train: {others_text(ranks, set(done))}. "
               "Their next collective has no partner.")
        site = next((rank_site(st) for st in waiting.values() if rank_site(st)), None)
        site = lint_line(lint, "DDP101", site, None) or site
        return Draft("DDP101", msg, FIX_101, location=loc(site), ranks=done,
                     evidence={"finished": done, **step_evidence(ranks)})
    counts = {r: st.steps_by_epoch for r, st in ranks.items()}
    for e in range(min((len(c) for c in counts.values()), default=0)):
        vals = {r: c[e] for r, c in counts.items()}
        if len(set(vals.values())) > 1:
            return uneven_steps(ranks, e, vals, "a rank finished while the others wait for it", lint=lint)
    return uneven_steps(ranks, "(all)", steps, "a rank finished while the others wait for it", lint=lint)


def _failed(ranks: dict[int, RankState]) -> list[Draft]:
    """The ranks whose failure caused the others' (``_root_ranks``): the stages' own split of their batches,
    DDP's unused-parameter error, one exception raised alike on several ranks, then each root rank's own."""
    out: list[Draft] = []
    roots = _root_ranks(ranks)
    inside = [r for r in roots if in_schedule(ranks[r])]
    split = microbatch_split(ranks, "then " + "; ".join(
        f"rank {r} raised {ranks[r].exc.type}: {gist(ranks[r].exc.message, 160)} at {where(ranks[r].exc.location)}"
        for r in inside) + (f"; meanwhile {others_text(ranks, set(inside))}" if others_text(ranks, set(inside)) else "")
        ) if inside else None
    if split is not None:  # the stages' own split of their batches: what each raised inside the schedule follows
        out.append(split)
        roots = [r for r in roots if r not in inside]
    unused = errors.diagnose_unused(ranks)  # DDP's unused-parameter error, on one rank or several
    if unused is not None:
        out.append(unused)
        roots = [r for r in roots if r not in unused.ranks]
    same_exc = [r for r in roots if ranks[r].exc]
    if len(same_exc) > 1:  # every such rank raised the same exception at the same line: one finding
        e = ranks[same_exc[0]].exc
        others = others_text(ranks, set(same_exc))
        msg = (f"Ranks {', '.join(map(str, same_exc))} raised {e.type}: {e.message} at "
               f"{where(e.location)}." + (f" Meanwhile: {others}." if others else ""))
        out.append(Draft("DDP204", msg, runtime_fix("DDP204.same-exception"), location=loc(e.location),
                         ranks=same_exc,
                         evidence={"exception": e, **step_evidence(ranks)}))
        roots = [r for r in roots if r not in same_exc]
    for r in roots[:4]:
        worker = errors.diagnose_worker_died(ranks, r) if ranks[r].exc else None
        # a DataLoader worker died: its loader, not the line where the error surfaced
        out.append(worker if worker is not None else _root_finding(r, ranks))
    return out


def _root_finding(r: int, ranks: dict[int, RankState]) -> Draft:
    """One root rank's end: its exception, torch's teardown race, gloo's abort on a mismatch, a signal (the
    out-of-memory killer), or an exit code."""
    st = ranks[r]
    ex = st.exit or ExitStatus()
    ex_ev = st.exit if st.exit else {}
    others = others_text(ranks, {r})
    if st.exc:
        e = st.exc
        site = e.location
        msg = (f"Rank {r} raised {e.type}: {e.message} at {where(site)}. This is the root cause; "
               f"the launcher's own error may name another rank. Meanwhile: {others}.")
        fix = runtime_fix("DDP204.exception")
        evidence = {"exception": e, "exit": ex_ev}
    elif ex.signal in ("SIGABRT", "SIGSEGV") and not st.exc and st.exit_code in (0, None) \
            and (st.done or st.teardown or _finished_with_the_others(r, ranks)):
        # torch tore itself down badly (in destroy_process_group or at exit): the training had completed
        site = st.exit_site or rank_site(st)
        when = ("had finished normally (its main returned)" if st.done
                else "was tearing down its process group (destroy_process_group)" if st.teardown
                else "had run every step the others ran, and they had all finished normally,")
        msg = (f"Rank {r}'s program {when} when the process died of "
               f"{ex.signal} during shutdown, after {st.step} steps: the training itself completed. This is "
               "torch's own teardown race (gloo/DDP print \"terminate called without an active exception\" when "
               "destroy_process_group() or interpreter exit tears down a collective's work still in flight), "
               f"not your training code; the launcher still reports the job as failed. Meanwhile: {others}.")
        fix = runtime_fix("DDP204.teardown")
        evidence = {"exit": ex_ev, "finished_program": True}
    elif ex.signal == "SIGABRT" and (c := fatal_call(st)) is not None:
        site = c.site or rank_site(st)
        msg = (f"Rank {r} was aborted by gloo (SIGABRT) inside {op_text(c)} at {where(site)}: gloo aborts a "
               "process whose collective receives data that does not fit the call it made, so this follows from "
               "the ranks' mismatched calls, and the others' broken connections follow from this abort. "
               f"Meanwhile: {others}.")
        fix = runtime_fix("DDP204.gloo-abort")
        evidence = {"exit": ex_ev, "last_line": site}
    elif ex.signal:
        site = rank_site(st)
        oom = ex.signal == "SIGKILL"
        msg = (f"Rank {r} was killed by {ex.signal}" + (
            " — on Linux almost always the out-of-memory killer (check `dmesg`)" if oom else "") +
            f"; its last line was {where(site)}. Meanwhile: {others}.")
        fix = runtime_fix("DDP204.oom") if oom else runtime_fix("DDP204.signal")
        evidence = {"exit": ex_ev, "last_line": site}
    else:
        site = rank_site(st)
        code = ex.exit_code
        msg = f"Rank {r} exited with code {code} at {where(site)} while the job was running. Meanwhile: {others}."
        fix = runtime_fix("DDP204.exit")
        evidence = {"exit": ex_ev}
    return Draft("DDP204", msg, fix, location=loc(site), ranks=[r], evidence={**evidence, **step_evidence(ranks)})
