"""Read PyTorch Flight Recorder dumps (one per rank) and diagnose them in ddp-doctor's report format.

torch records every collective of every process group in a ring buffer (``TORCH_FR_BUFFER_SIZE``
> 0; NCCL also under its older name ``TORCH_NCCL_TRACE_BUFFER_SIZE``): the op (``profiling_name``,
e.g. ``gloo:all_reduce``), the group and the per-group ``collective_seq_id``, input/output sizes and
dtypes, and the Python stack of the call.  NCCL's watchdog writes the buffer on a timeout to
``TORCH_FR_DUMP_TEMP_FILE`` (older: ``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``) + rank; gloo records but
never dumps by itself, so :func:`write_dump` does it (call it when a collective times out).
A dump is a pickle (or, from ``_dump_fr_trace_json``, JSON) with ``version``, ``pg_config``
(group name -> ranks) and ``entries``.  As torch's ``fr_trace`` does, entries are matched across
ranks by group and ``collective_seq_id``; unlike it, the verdict names the rank that diverged and
its *user* line (library frames skipped), with the catalogue's codes and fixes.
"""
from __future__ import annotations

import ast
import json
import os
import pickle
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from ddp_doctor.attach.classify import StackActivity, classify
from ddp_doctor.diagnose.blame import lint_rank_conditional
from ddp_doctor.diagnose.common import loc, verdict_of, where
from ddp_doctor.diagnose.draft import Draft
from ddp_doctor.diagnose.stuck import Kind, Standing, Stuck, judge
from ddp_doctor.diagnose.wording import decided
from ddp_doctor.evidence import Collective, LintMark, RankState, Site
from ddp_doctor.findings import Finding, runtime_fix

DEFAULT_PREFIX_ENV = ("TORCH_FR_DUMP_TEMP_FILE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")


class FlightRecorderError(ValueError):
    """The directory holds no readable Flight Recorder dump (the message says what was found)."""


@dataclass(frozen=True)
class Entry:
    """One recorded collective (or p2p op) of one rank."""

    group: str
    group_desc: str
    seq: int
    p2p_seq: int
    is_p2p: bool
    op: str
    input_sizes: tuple
    input_dtypes: tuple
    output_sizes: tuple
    state: str
    frames: tuple[Site, ...]  # outermost first

    def collective(self) -> Collective:
        """The adapter to the shared policy: this entry as the run path records a call (``diagnose.blame``
        compares them by ``Collective.must_agree``, the live watcher's rule).  A call from no user
        collective's frame (the autograd thread's gradient all-reduce, DDP's broadcasts) is DDP's own."""
        shapes = tuple("x".join(map(str, s)) if isinstance(s, tuple) else str(s) for s in self.input_sizes)
        kind = self.activity.kind
        origin = "user" if kind in ("collective", "object_collective") else "ddp"
        return Collective(self.group, self.seq, self.op, shapes, self.input_dtypes, self.activity.site, origin)

    def agrees(self) -> tuple:
        """What the ranks' entries at this position must share (``evidence/agreement.py``)."""
        return self.collective().must_agree()

    @cached_property
    def activity(self) -> StackActivity:
        """Where the call stands, read from its stack once (entries are compared many times)."""
        return classify(list(self.frames))

    def report_call(self) -> dict[str, Any]:
        shape = (list(self.input_sizes[0]) if len(self.input_sizes) == 1 else [list(s) for s in self.input_sizes]) \
            if self.input_sizes else None
        # gloo records every entry as "scheduled" (it does not track start/completion): not worth showing
        return {"op": self.op, "seq": self.seq, "group": self.group_desc or self.group, "shape": shape,
                "dtype": ",".join(self.input_dtypes) or None,
                "state": None if self.state == "scheduled" else self.state}


@dataclass
class RankDump:
    """One rank's dump."""

    rank: int
    path: str
    version: str
    groups: dict[str, list[int]]  # group name -> global ranks
    entries: list[Entry] = field(default_factory=list)


def _as_tuple(x) -> tuple:
    return tuple(_as_tuple(v) if isinstance(v, list) else v for v in (x or []))


def _entry(e: dict) -> Entry:
    pg = e.get("process_group") or ("", "")
    frames = tuple(Site(f.get("filename") or "?", int(f.get("line") or 0), f.get("name"))
                   for f in reversed(e.get("frames") or []))
    op = str(e.get("profiling_name") or "?").split(":", 1)[-1]
    return Entry(str(pg[0]), str(pg[1]) if len(pg) > 1 else "", int(e.get("collective_seq_id") or 0),
                 int(e.get("p2p_seq_id") or 0), bool(e.get("is_p2p")), op, _as_tuple(e.get("input_sizes")),
                 tuple(e.get("input_dtypes") or ()), _as_tuple(e.get("output_sizes")), str(e.get("state") or ""),
                 frames)


def _groups(pg_config: dict) -> dict[str, list[int]]:
    out = {}
    for key, cfg in (pg_config or {}).items():
        ranks = cfg.get("ranks") if isinstance(cfg, dict) else None
        if isinstance(ranks, str):
            try:
                ranks = ast.literal_eval(ranks)
            except (ValueError, SyntaxError):
                ranks = None
        name = str(cfg.get("name", key)) if isinstance(cfg, dict) else str(key)
        out[name] = list(ranks) if isinstance(ranks, (list, tuple)) else []
    return out


def read_dump(path: str | os.PathLike[str]) -> RankDump | None:
    """One dump file; None when it is not a Flight Recorder dump or has no rank number in its name."""
    m = re.search(r"(\d+)(?:\.json|\.pkl|\.pickle)?$", os.path.basename(str(path)))
    if not m:
        return None
    raw = Path(path).read_bytes()
    try:
        data = pickle.loads(raw)
    except Exception:
        try:
            data = json.loads(raw.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return None
    if not isinstance(data, dict) or "entries" not in data:
        return None
    return RankDump(int(m.group(1)), str(path), str(data.get("version", "")), _groups(data.get("pg_config")),
                    [_entry(e) for e in data.get("entries") or [] if isinstance(e, dict)])


def read_dir(directory: str | os.PathLike[str]) -> list[RankDump]:
    """Every rank's dump under ``directory`` (recursively), by rank."""
    d = Path(directory)
    if not d.is_dir():
        raise FlightRecorderError(f"{directory} is not a directory")
    dumps: dict[int, RankDump] = {}
    for p in sorted(d.rglob("*")):
        if p.is_file():
            rd = read_dump(p)
            if rd is not None:
                dumps[rd.rank] = rd
    if not dumps:
        raise FlightRecorderError(
            f"no Flight Recorder dump in {directory}: expected one file per rank named PREFIX<rank> (as written by "
            "TORCH_FR_DUMP_TEMP_FILE / TORCH_NCCL_DEBUG_INFO_TEMP_FILE, or ddp_doctor.flightrec.write_dump), with "
            "TORCH_FR_BUFFER_SIZE > 0 set in the job")
    return [dumps[r] for r in sorted(dumps)]


def write_dump(prefix: str | None = None) -> str | None:
    """Write this rank's Flight Recorder buffer to ``prefix + rank`` (gloo does not dump on timeouts itself).

    ``prefix`` defaults to ``$TORCH_FR_DUMP_TEMP_FILE`` or ``/tmp/torch_fr_trace_rank_``; returns the path,
    or None when the job records nothing (``TORCH_FR_BUFFER_SIZE`` unset) or this torch has no recorder.
    Typical use: ``except RuntimeError: ddp_doctor.flightrec.write_dump(); raise`` around the training loop.
    """
    if not any(int(os.environ.get(k) or 0) > 0 for k in ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")):
        return None  # nothing was recorded: an empty dump would read as "this rank ran no collective"
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import _dump_fr_trace
    except ImportError:
        return None
    prefix = prefix or next((os.environ[k] for k in DEFAULT_PREFIX_ENV if os.environ.get(k)),
                            "/tmp/torch_fr_trace_rank_")
    rank = dist.get_rank() if dist.is_initialized() else int(os.environ.get("RANK", 0))
    data = _dump_fr_trace(includeCollectives=True, includeStackTraces=True, onlyActive=False)
    if not data:
        return None
    path = f"{prefix}{rank}"
    from ddp_doctor.atomic import write_atomic

    write_atomic(path, data)
    return path


# -- diagnosis ---------------------------------------------------------------------------------------
FIX_201, FIX_202, FIX_203 = runtime_fix("DDP201"), runtime_fix("DDP202"), runtime_fix("DDP203")


def _loc(e: Entry):
    return loc(e.activity.site)


def _desc(e: Entry) -> str:
    sizes = "x".join(map(str, e.input_sizes[0])) if len(e.input_sizes) == 1 else \
        ",".join("x".join(map(str, s)) for s in e.input_sizes)
    dt = ",".join(e.input_dtypes)
    what = e.op + (f" [{sizes}]" if sizes else "") + (f" {dt}" if dt else "")
    return f"{what} (#{e.seq}) at {where(e.activity.site)}"


def judge_dumps(dumps: list[RankDump], lint: tuple[LintMark, ...] | None = None
             ) -> tuple[str, list[Finding], dict[int, Entry | None]]:
    """(verdict, findings, each rank's last recorded collective) from every rank's dump; ``lint``: lint's marks
    (default: lint the user's files the entries' stacks name, where they exist here)."""
    have = {d.rank: d for d in dumps}
    members = sorted({r for d in dumps for rs in d.groups.values() for r in rs} | set(have))
    missing = [r for r in members if r not in have]
    last: dict[int, Entry | None] = {}
    by_group: dict[str, dict[int, dict[int, Entry]]] = {}
    for d in dumps:
        coll = [e for e in d.entries if not e.is_p2p]
        last[d.rank] = max(coll, key=lambda e: e.seq) if coll else None
        for e in coll:
            by_group.setdefault(e.group, {}).setdefault(d.rank, {})[e.seq] = e
    findings: list[Draft] = []
    desync = False
    flags = lint_rank_conditional(e.activity.site.path for d in dumps for e in d.entries if e.activity.site) \
        if lint is None else lint
    for group, per_rank in sorted(by_group.items()):
        ranks_in = sorted(per_rank)
        group_ranks = next((d.groups.get(group) for d in dumps if d.groups.get(group)), None) or ranks_in
        present = [r for r in group_ranks if r in per_rank]
        lo = max(min(per_rank[r]) for r in present)  # older entries may have left a ring buffer
        hi = max(max(per_rank[r]) for r in present)
        for seq in range(lo, hi + 1):
            at = {r: per_rank[r].get(seq) for r in present}
            there = {r: e for r, e in at.items() if e is not None}
            behind = sorted(r for r, e in at.items() if e is None)
            if len({e.agrees() for e in there.values()}) == 1 and not behind:
                continue
            j = judge(DumpPosition(there, behind, [r for r in missing if r in group_ranks], flags))
            if j.kind == Kind.PAIRED:
                findings.append(_disagreement(seq, there, j))
                if all(max(per_rank[r]) > seq for r in present):  # they went on past it: paired silently
                    desync = True
            else:
                findings.append(_behind(seq, there, behind, per_rank, j))
            break
        if findings:
            break
    if missing:
        findings.append(_no_dump(missing, dumps, last, by_group, flags, parted=bool(findings)))
    verdict = verdict_of(("desync" if desync else "hang") if any(f.severity.value == "error" for f in findings)
                         else None)
    # where the ranks parted, as run and attach say it: each rank stands at its last recorded call's stack
    standing = {r: RankState(rank=r, stack=e.frames) for r, e in last.items() if e is not None}
    return verdict, decided(findings, standing), last


class DumpPosition:
    """Flight Recorder's evidence for the judge (``diagnose.stuck``): every rank's entry at one position of one
    group (where the ranks parted, or their last), the ranks with no entry there (behind: outside collectives)
    and those that wrote no dump (gone).  No history a judge could trust (a ring buffer), no sign of life."""

    def __init__(self, there: dict[int, Entry], behind: list[int], gone: list[int], lint: tuple[LintMark, ...]):
        self.there, self.behind, self.gone, self.marks = there, behind, gone, tuple(lint)

    def standings(self) -> dict[int, Standing]:
        return {**{r: Standing(r, e.collective()) for r, e in self.there.items()},
                **{r: Standing(r) for r in self.behind}, **{r: Standing(r, gone=True) for r in self.gone}}

    def history(self) -> None:
        return None

    def lint(self) -> tuple[LintMark, ...]:
        return self.marks


def _no_dump(missing: list[int], dumps: list[RankDump], last: dict[int, Entry | None],
             by_group: dict[str, dict[int, dict[int, Entry]]], lint: tuple[LintMark, ...], parted: bool) -> Draft:
    """DDP204 for the ranks that wrote no dump: the cause (an error) where the judge finds the others waiting for
    them at their last recorded call and nothing parted before; a note (a warning) beside a parting."""
    ref = next((last[r] for r in sorted(last) if last[r] is not None), None)
    msg = (f"{'Rank' if len(missing) == 1 else 'Ranks'} {', '.join(map(str, missing))} wrote no Flight Recorder "
           "dump: crashed or killed (gloo aborts a rank on a size mismatch), stuck before its timeout handler, "
           "or run with TORCH_FR_BUFFER_SIZE unset.")
    cause = not parted
    if ref is not None:
        holder = next(d for d in dumps if d.rank == min(r for r in last if last[r] is not None))
        recent = sorted((e for e in holder.entries if not e.is_p2p and e.group == ref.group),
                        key=lambda e: e.seq)[-3:]
        msg += (f" Rank {holder.rank}'s last recorded collectives: " + "; ".join(_desc(e) for e in recent) + ".")
        if cause:  # the members' last recorded call of that group, where they wait for the ranks gone
            per_rank = by_group[ref.group]
            there = {r: es[max(es)] for r, es in per_rank.items()}
            cause = judge(DumpPosition(there, [], missing, lint)).kind == Kind.GONE
    return Draft("DDP204", msg, runtime_fix("DDP204.no-dump"), location=_loc(ref) if ref else None, ranks=missing,
                 severity="error" if cause else "warning", evidence={"missing_dumps": missing})


def _disagreement(seq, there: dict[int, Entry], b: Stuck) -> Draft:
    """Ranks recorded different calls at one sequence number: the odd ones out, as the judge decided
    (``diagnose.stuck``)."""
    per_rank = "; ".join(f"rank {r}: {_desc(e)}" for r, e in sorted(there.items()))
    ev = {"seq": seq, "group": next(iter(there.values())).group_desc,
          "calls": {str(r): e.report_call() | {"site": e.activity.site.to_json() if e.activity.site else None}
                    for r, e in there.items()}}
    e = there[b.ranks[0]]
    head = f"At collective #{seq} of group {e.group_desc or e.group} the ranks recorded different"
    if b.code in ("DDP201", "DDP202"):
        fix = FIX_201 if b.code == "DDP201" else FIX_202
        if b.lint_seen:
            msg = (f"{head} calls: {per_rank}. ddp-doctor lint flags rank {b.ranks[0]}'s line as {b.code} (reached "
                   "under a rank-dependent condition).")
        else:
            internal = next(x for r, x in sorted(there.items()) if r not in b.ranks)
            msg = (f"{head} calls: {per_rank}. {'Rank' if len(b.ranks) == 1 else 'Ranks'} "
                   f"{', '.join(map(str, b.ranks))} called {e.op} where the other ranks were in DDP's own "
                   f"{internal.op} (the training step): a collective only some ranks reach.")
        return Draft(b.code, msg, fix, location=loc(b.site), ranks=list(b.ranks), evidence=ev)
    what = "ops" if len({x.op for x in there.values()}) > 1 else (
        "shapes" if len({x.input_sizes for x in there.values()}) > 1 else "dtypes")
    msg = f"{head} {what}: {per_rank}. The ranks paired calls that do not match (hang, crash or silently wrong data)."
    return Draft("DDP203", msg, FIX_203, location=loc(b.site), ranks=list(b.ranks), evidence=ev)


def _behind(seq, there: dict[int, Entry], behind: list[int], per_rank, j: Stuck) -> Draft:
    """Ranks with no entry at a position the others entered: the judge's answer, worded with the dumps' facts
    (the waiting ones in a collective lint calls rank-conditional, or the ones behind stalled)."""
    e = next(iter(there.values()))
    ahead = sorted(there)
    lasts = {r: per_rank[r][max(per_rank[r])] for r in behind}
    was = "; ".join(f"rank {r}'s last recorded collective is {_desc(x)}" for r, x in sorted(lasts.items()))
    ev = {"seq": seq, "group": e.group_desc or e.group,
          "waiting": {str(r): x.report_call() for r, x in there.items()},
          "last": {str(r): x.report_call() for r, x in lasts.items()}}
    if j.kind == Kind.SUBSET:
        msg = (f"Ranks {', '.join(map(str, j.ranks))} entered {_desc(e)}, which ranks {', '.join(map(str, behind))} "
               "never "
               f"reached ({was}); ddp-doctor lint flags that line as {j.code} (reached under a rank-dependent "
               "condition).")
        return Draft(j.code, msg, FIX_201 if j.code == "DDP201" else FIX_202, location=_loc(e), ranks=list(j.ranks),
                     evidence=ev)
    msg = (f"{'Rank' if len(behind) == 1 else 'Ranks'} {', '.join(map(str, behind))} never reached collective #{seq} "
           f"({_desc(e)}, entered by rank {', '.join(map(str, ahead))}): {was}, so it stalled outside collectives "
           "after that line (data loading, I/O, a lock) or ended.")
    site = lasts[behind[0]]
    return Draft("DDP205", msg, runtime_fix("DDP205.stall"), location=_loc(site), ranks=behind, evidence=ev)


def dumps_report(directory: str, dumps: list[RankDump]) -> dict[str, Any]:
    """The report/v1 object of a job's Flight Recorder dumps."""
    from ddp_doctor.report.ranks import RankWord, rank_entry

    verdict, findings, last = judge_dumps(dumps)
    members = sorted({r for d in dumps for rs in d.groups.values() for r in rs} | {d.rank for d in dumps})
    ranks = []
    for r in members:
        e = last.get(r)
        state = RankWord.IN_COLLECTIVE if e is not None else (RankWord.NO_DUMP if r not in last else RankWord.UNKNOWN)
        ranks.append(rank_entry(r, state, last_collective=e.report_call() if e else None,
                                stack=[f.to_json() for f in e.frames] if e else [],
                                where=e.activity.site.to_json() if e and e.activity.site else None))
    from ddp_doctor.report import report_v1
    from ddp_doctor.report.snippets import stack_sources

    return report_v1(verdict, len(members), [f.to_report_dict() for f in findings], ranks,
                     sources=stack_sources(r["stack"] for r in ranks), source="flight_recorder",
                     flight_recorder={"dir": str(directory), "files": {str(d.rank): d.path for d in dumps},
                                      "version": dumps[0].version if dumps else None})
