"""``diagnose(evidence, decision)``: the verdict and findings of a job, from every code family's module.
The package's entry point (``from ddp_doctor.diagnose import diagnose``); loaded only when a diagnosis is
made, never by the live judge a rank's watcher runs every poll."""
from __future__ import annotations

from ddp_doctor.diagnose import collectives, exits, groups, hang, joined, steps
from ddp_doctor.diagnose.common import verdict_of
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.diagnose.wording import decided
from ddp_doctor.evidence import ExitStatus, JobEvidence, Verdict, missing_rank
from ddp_doctor.findings import Finding


def diagnose(evidence: JobEvidence, decision: Verdict | None,
             failures: dict[int, ExitStatus] | None = None) -> tuple[str, list[Finding]]:
    """Verdict ("ok" | "stalled" | "hang" | "crash" | "desync") and findings, most important first.

    ``decision`` "stalled": the diagnosis of a stall while the job runs on (where every rank is, what the
    stuck ones are blocked on); a job that ended well after stalls gets an info finding for each.

    ``failures``: exit status per global rank the launcher learned after the job ended, merged into
    the evidence (a rank the watcher never heard from is added as missing).
    """
    ranks = dict(evidence.ranks)
    for r, info in (failures or {}).items():
        st = ranks.get(r) or missing_rank(r)
        if not st.exit:
            ranks[r] = st.with_(exit=info)
    evidence = evidence.with_(ranks=ranks)
    reason = decision.reason if decision else None
    findings: list[Draft] = []  # what each code family saw; ruled on and worded once, at the end
    verdict = "ok"
    failed = any(st.failed for st in ranks.values())
    stale = exits.diagnose_restart_connect(evidence) if reason in ("exit", "hang") or failed else None
    if stale is not None:  # restarted ranks could not connect: nothing after that is its own cause
        return verdict_of("hang" if reason == "hang" else "exit"), decided([stale], ranks, evidence.lint)
    waited = exits.timeouts_as_waits(ranks) if reason != "desync" and (reason == "exit" or failed) else {}
    if waited:  # a collective timed out waiting for a rank that never came: judge the wait, not the timeout
        e = next(iter(ranks[r].exc for r in waited))
        evidence = evidence.with_(ranks={**ranks, **waited})
        ranks, failed = evidence.ranks, False
        reason, decision = "hang", Verdict("hang", limit_how=f"{e.collective.op} timed out on rank "
                                                              f"{', '.join(map(str, sorted(waited)))}: {e.type}")
    # a rank ended while others waited for it (the ranks of a lost node and their consequences aside)
    ended = exits.finished_case(exits.beyond_lost_nodes(evidence, ranks), decision)
    if reason == "desync":
        failed_then = decision.failed if decision.failed is not None else failed
        verdict = verdict_of("desync", failed=bool(failed_then), blocked=bool(decision.blocked))
        findings += collectives.diagnose_desync(evidence, decision)
    elif reason in ("hang", "stalled"):
        verdict = verdict_of(reason)
        findings += exits.diagnose_lost_nodes(evidence)  # several nodes: an agent that went silent first
        findings += hang.diagnose_hang(evidence, decision)
        if decision.kind == "frozen-workers":  # the fact that made the stall a stop
            findings = hang.frozen_proof(decision, findings)
        if reason == "stalled":  # no proof: the job runs on; say so, and what would stop it
            findings = hang.still_watching(evidence, findings)
    elif reason == "exit" or failed or ended:
        # a rank left early: sys.exit() is an exit (crash); a loop left early is uneven steps (desync)
        done_exit = [st for st in ranks.values() if st.done and st.exit_site]
        verdict = verdict_of("exit", ended_early=bool(ended) and not done_exit)
        if not ended:  # a collective of the user's inside a Join another rank joined, else a mismatch gloo aborted on
            findings += (joined.diagnose_join_own_collective(evidence)
                         or collectives.diagnose_fatal_collective(evidence))
        findings += exits.diagnose_exit(evidence, decision or Verdict("exit"))
    # (step counts that differ in a job that ended well are no finding: they are inferred from loader passes
    # and optimizer steps, and a correct job has them -- DDP's Join, a rank-local optimizer; docs/verdicts.md)
    if verdict != "ok" and not any(f.code == "DDP202" for f in findings):
        findings = collectives.diagnose_ddp_subset(evidence) + findings
    findings += steps.diagnose_sampler(evidence)
    findings += groups.diagnose_groups(evidence)  # a warning whatever the verdict: it never stops a job
    if verdict == "ok":
        findings += steps.syncs_out_of_step(evidence)  # (never a stop: the job ended well)
        findings += hang.stalls_resumed(evidence)  # (before the longest warning: the same wait, in more words)
        findings += hang.slow_not_stuck(evidence)
        findings += _perf(evidence)
    # why: where the ranks parted, the code and culprits that implies (``ruling.rule``), then the words
    return verdict, _dedupe(decided(findings, dict(evidence.ranks), evidence.lint))


def diagnose_guarded(evidence: JobEvidence, decision: Verdict | None,
                     failures: dict[int, ExitStatus] | None = None) -> tuple[str, list[Finding], str | None]:
    """:func:`diagnose`, and when it raises (a bug of ours), the verdict the facts already give with no
    finding, and the error in words: the user keeps the verdict, the exit code and every rank's state."""
    try:
        verdict, findings = diagnose(evidence, decision, failures)
        return verdict, findings, None
    except Exception as e:
        return _verdict_of(evidence, decision, failures), [], failure_text(e)


def failure_text(e: BaseException) -> str:
    """A diagnosis's own error in one line, with the line of ours that raised (the report's diagnosis_error)."""
    import traceback

    tb = traceback.extract_tb(e.__traceback__)
    at = f" at {tb[-1].filename.rsplit('/', 1)[-1]}:{tb[-1].lineno}" if tb else ""
    return f"{type(e).__name__}: {e}{at}"


def _verdict_of(evidence: JobEvidence, decision: Verdict | None, failures: dict[int, ExitStatus] | None) -> str:
    """The verdict without the diagnosis: the live decision's reason, else whether a rank failed."""
    failed = any(st.failed for st in evidence.ranks.values()) or any(
        (x.exit_code or 0) != 0 for x in (failures or {}).values())
    if decision is None:
        return verdict_of("exit" if failed else None)
    if decision.reason == "desync":
        return verdict_of("desync", failed=bool(decision.failed), blocked=bool(decision.blocked))
    if decision.reason in ("hang", "stalled"):
        return verdict_of(decision.reason)
    return verdict_of("exit", ended_early=bool(decision.finished) and not failed)


def _perf(evidence: JobEvidence) -> list[Draft]:
    from ddp_doctor.diagnose.perf import diagnose_perf

    try:
        return list(diagnose_perf(evidence.to_json()))  # the perf family still reads the wire form
    except Exception as e:  # a perf diagnosis must never hide the run's verdict
        import sys

        print(f"ddp-doctor: perf diagnosis failed: {e!r}", file=sys.stderr)
        return []


def _dedupe(findings: list[Finding]) -> list[Finding]:
    seen: set[tuple] = set()
    out = []
    for f in findings:
        key = (f.code, f.location.path if f.location else None, f.location.line if f.location else None,
               tuple(sorted(f.ranks)))
        if key in seen:
            continue
        seen.add(key)
        out.append(f)
    out.sort(key=lambda f: -f.severity.rank)
    return out
