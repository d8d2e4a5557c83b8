"""The one vocabulary of ddp-doctor: the finding-code catalogue and the Finding type.

Lint rules, runtime diagnoses and ``check`` all report through :class:`Finding`
with a code from :data:`CATALOGUE`, so a hazard has the same name wherever it is
seen.  This module depends on nothing else in the package (nor on torch).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class Severity(str, enum.Enum):
    """How bad a finding is: error (hang, crash, corruption), warning (wrong or wasteful), info."""

    ERROR = "error"
    WARNING = "warning"
    INFO = "info"

    @property
    def rank(self) -> int:
        """Ordering for fail levels: higher is worse."""
        return {"info": 0, "warning": 1, "error": 2}[self.value]


# The step family: codes of ranks that fell out of step (a collective or a DDP step some ranks make and others
# do not).  Where the ranks parted is a decision in the user's code (diagnose/provenance.py locates it), and
# lint's guess at the cause may carry another of these codes than the runtime's name for what happened (lint
# DDP201 at a line the runtime calls DDP202 / DDP203).  A rank that ended early (ENDED_EARLY) is how such a
# hazard ends when the loop itself is rank-dependent: it confirms lint's step-family code on that line.
STEP_FAMILY = frozenset({"DDP101", "DDP201", "DDP202", "DDP203"})
ENDED_EARLY = "DDP204"


def severity_rank(value: str | None) -> int:
    """The one order of severities (higher is worse; ``Severity.rank``) for a report's severity string, -1
    for none known: renderers sort by it, and lint takes a graver runtime severity by it."""
    try:
        return Severity(value).rank
    except ValueError:
        return -1


@dataclass(frozen=True)
class CodeInfo:
    """One catalogue entry: a stable code, its kebab-case name, default severity and a one-line title."""

    code: str
    name: str
    severity: Severity
    title: str


def _entries(*rows: tuple[str, str, str, str]) -> dict[str, CodeInfo]:
    return {code: CodeInfo(code, name, Severity(sev), title) for code, name, sev, title in rows}


# Codes are stable; a new hazard gets a new number.  Keep in step with ../shared/DESIGN.md.
CATALOGUE: dict[str, CodeInfo] = _entries(
    ("DDP101", "uneven-steps", "error", "Ranks run different numbers of training steps"),
    ("DDP102", "sampler-epoch-not-set", "warning", "DistributedSampler.set_epoch() is never called"),
    ("DDP103", "shuffle-with-sampler", "error", "DataLoader gets both shuffle=True and a sampler (ValueError at start)"),
    ("DDP104", "collate-may-return-none", "warning", "collate_fn can return None"),
    ("DDP105", "loader-without-distributed-sampler", "warning", "Training loader has no DistributedSampler"),
    ("DDP201", "rank-conditional-collective", "error", "Collective reached by only some ranks"),
    ("DDP202", "ddp-forward-on-subset-of-ranks", "error", "DDP model called on only some ranks"),
    ("DDP203", "collective-mismatch", "error", "Ranks call different collectives at the same point"),
    ("DDP204", "rank-exited", "error", "A rank exited while the others wait"),
    ("DDP205", "stalled-outside-collectives", "error",
     "A rank is stuck outside collectives (the others wait for it, or no rank progresses)"),
    ("DDP206", "launch-not-at-entry", "warning", "Distributed launch/init outside the program entry"),
    ("DDP301", "load-without-map-location", "warning", "torch.load without map_location"),
    ("DDP302", "cuda-before-set-device", "warning", "CUDA used before torch.cuda.set_device(local_rank)"),
    ("DDP303", "save-on-every-rank", "warning", "torch.save reached by every rank"),
    ("DDP401", "data-bound", "warning", "Training waits on the data loader"),
    ("DDP402", "loader-without-pin-memory", "info", "Batches copied to CUDA from unpinned memory"),
    ("DDP403", "workers-not-persistent", "info", "DataLoader workers restart every epoch"),
    ("DDP404", "straggler-rank", "warning", "One rank is consistently slower than the others"),
    ("DDP405", "find-unused-parameters", "info", "find_unused_parameters=True costs an extra graph traversal"),
    ("DDP406", "batchnorm-without-syncbn", "info", "BatchNorm in a DDP model without SyncBatchNorm"),
    # DDP5xx: found by `ddp-doctor check` (pre-flight test of the environment and every rank's links);
    # `ddp-doctor run` also reports DDP501 for restarted ranks that cannot connect (stale rendezvous store)
    ("DDP501", "rank-did-not-start", "error", "A rank did not start or did not join the rendezvous"),
    ("DDP502", "link-failed", "error", "A collective or point-to-point transfer failed or missed its deadline"),
    ("DDP503", "wrong-collective-result", "error", "A collective delivered wrong data to a rank"),
    ("DDP504", "shm-too-small", "error", "/dev/shm is too small for the DataLoader workers"),
    ("DDP505", "resource-limit-low", "warning", "Open-file or process limit too low for ranks and workers"),
    ("DDP506", "cpu-oversubscribed", "warning", "More busy threads than CPUs on a node"),
    ("DDP507", "stale-distributed-env", "warning", "Deprecated, contradictory or slow-path NCCL/torch environment variables"),
    ("DDP508", "version-mismatch", "error", "torch / CUDA / NCCL / Python versions differ across ranks"),
    ("DDP509", "device-assignment", "error", "Ranks on a node share a GPU or have none"),
    # found by `ddp-doctor run`: the launch configuration, seen from inside the ranks
    ("DDP510", "ranks-not-one-group", "warning", "The launched processes never formed one process group"),
)


# What to change, per runtime code (``CODE`` or ``CODE.case``): the one place these texts live; the
# diagnosis composes the message (what happened, which rank, which line) and takes the fix from here.
# Performance codes (DDP3xx/4xx) compose fixes from their measurements (workers to use, the slow phase).
RUNTIME_FIXES: dict[str, str] = {
    "DDP101": (
        "Make every rank run the same number of steps: agree on skips/early stops with "
        "`ddp_doctor.fixes.agree(flag)` (all_reduce of the decision) or "
        "`ddp_doctor.fixes.skip_if_nonfinite(loss)`; give every rank the same number of batches with "
        "`ddp_doctor.fixes.EvenBatches` / DistributedSampler."),
    "DDP102": (
        "Call `sampler.set_epoch(epoch)` at the start of every epoch, before iterating the loader."),
    "DDP201": (
        "Call the collective on every rank of its group (move it out of the rank-dependent branch), or "
        "make only rank 0 do the work and let the others wait at a barrier every rank reaches, e.g. `with"
        " ddp_doctor.fixes.rank_zero_first(): ...`."),
    "DDP201.count": (
        "Make every rank run the loop the same number of times: agree on the count first "
        "(`n = torch.tensor([len(batches)]); dist.all_reduce(n, op=dist.ReduceOp.MAX)` and let the ranks with "
        "fewer batches run on a dummy or empty batch for the rest, or `ReduceOp.MIN` and drop the extra "
        "batches), or pad each rank's data to one length (`DistributedSampler` pads; `drop_last=False`)."),
    "DDP201.join": (
        "Inside `with Join([model])` call only what the Join's joinables shadow (the DDP model's forward and "
        "backward, a ZeroRedundancyOptimizer's step): move your own collectives (a logged loss's all_reduce, "
        "a barrier) after the Join block, or make every rank's inputs even so that no rank joins early."),
    "DDP202": (
        "Do not call the DDP-wrapped model on a subset of ranks: evaluate `model.module` (the unwrapped "
        "model) on rank 0, or run the evaluation on every rank and reduce the metric; or construct DDP "
        "with broadcast_buffers=False if the buffers need no sync."),
    "DDP203": (
        "Make every rank call the same collectives in the same order with the same shapes and dtypes; for"
        " per-rank variable-size tensors use `ddp_doctor.fixes.gather_variable(...)` (or "
        "all_gather_object) instead of all_gather."),
    "DDP203.microbatches": (
        "Give every pipeline stage the same `n_microbatches` (a constant of the run, or agree on it before building "
        "the schedule: `n = torch.tensor([n_micro]); dist.all_reduce(n, op=dist.ReduceOp.MIN)`), and split batches of "
        "one size on every stage (pad or drop the rest), so that each stage's micro-batches pair with the others'."),
    "DDP203.splits": (
        "Exchange the counts first: `dist.all_to_all_single(recv_counts, send_counts)` (one count per rank), "
        "then pass `output_split_sizes=recv_counts.tolist()` and `input_split_sizes=send_counts.tolist()`, so "
        "that what each rank expects is what the others send."),
    "DDP203.lists": (
        "Pass lists of the same length on every rank: box a per-rank list as one object "
        "(`broadcast_object_list([items])`, `all_gather_object(out, items)`), or agree on the length first."),
    "DDP203.pad": (
        "Exchange the sizes first (all_gather of each rank's length), pad every rank's tensor to the largest "
        "and trim after the collective (`ddp_doctor.fixes.gather_variable(...)`), or use all_gather_object."),
    "DDP203.group": (
        "Compute new_group's arguments identically on every rank (from values all ranks agree on, e.g. "
        "all-gathered first) and call it on every rank, members or not, in the same order; a group that "
        "only its members create takes `new_group(ranks, use_local_synchronization=True)`."),
    "DDP203.not_member": (
        "Pass each rank a group it belongs to: new_group() returns a placeholder on the ranks it does not "
        "contain, and a collective on it is skipped with only a warning. Pick the group by membership (for pairs "
        "of ranks `groups[rank // 2]`; `dist.new_subgroups()` returns each rank's own), or call "
        "`dist.get_process_group_ranks(group)` and check the rank is in it before the collective."),
    "DDP204": (
        "Find why that rank ended (its stderr / the launcher's log: an exception, the OOM killer, sys.exit) and "
        "make every rank stop together; torchrun's agent tears the others down only when a rank *fails*."),
    "DDP204.no-dump": (
        "Look at that rank's stderr for an abort or exception; make every rank record and dump "
        "(TORCH_FR_BUFFER_SIZE, TORCH_FR_DUMP_TEMP_FILE)."),
    "DDP204.finished": (
        "Make every rank leave the training loop at the same step (agree on early stops with "
        "`ddp_doctor.fixes.agree(...)`)."),
    "DDP204.exception": (
        "Fix the exception on that line (full traceback in the report's rank entry). If only some ranks "
        "can hit it (rank-dependent data), make all ranks agree before acting, e.g. "
        "`ddp_doctor.fixes.agree(flag)`, so they stop together."),
    "DDP204.same-exception": (
        "Fix the exception on that line (full traceback in the report's rank entries)."),
    "DDP204.gloo-abort": (
        "Fix the collective mismatch reported with it: every rank must make the same collectives in the same "
        "order, with sizes that fit each other."),
    "DDP204.oom": (
        "Reduce memory per rank: smaller batch, fewer DataLoader workers / prefetch_factor, load "
        "checkpoints with map_location (`ddp_doctor.fixes.load_checkpoint`)."),
    "DDP204.signal": (
        "Find who sent the signal (scheduler preemption, a timeout, a user) or handle it."),
    "DDP204.teardown": (
        "Let every rank finish its collectives before tearing down: call dist.barrier() just before "
        "dist.destroy_process_group() (and drop the DDP model first: `del model`)."),
    "DDP204.exit": (
        "Find why the rank called exit (sys.exit / os._exit) and make every rank stop together."),
    "DDP204.unused-parameters": (
        "If those parameters are legitimately left out on some iterations or ranks, pass "
        "`find_unused_parameters=True` to DDP(...) (one extra graph traversal per step); if the same ones are "
        "unused in every iteration, `static_graph=True` also works. Otherwise make them contribute to the loss on "
        "every rank (run the branch everywhere, or add `0.0 * out.sum()` of the unused output to the loss), or "
        "freeze (`requires_grad_(False)`) or remove the parameters never used, before wrapping the model in DDP."),
    "DDP204.unused-outputs": (
        "find_unused_parameters=True cannot help here: DDP searches from forward's outputs, not from the loss. Use"
        " every output in the loss (`loss = loss + 0.0 * aux.sum()` if one must not count), stop returning the "
        "ones you do not use (or return them detached), return tensors in a tuple, list or dict, or freeze "
        "(`requires_grad_(False)`) the parameters that produce an unused output before wrapping the model in DDP."),
    "DDP204.unused-static-graph": (
        "static_graph=True promises that the same parameters get gradients in every iteration: drop it and pass "
        "`find_unused_parameters=True`, or make forward use the same parameters every time."),
    "DDP204.worker-oom": (
        "Give the DataLoader workers less to hold: fewer workers or a smaller prefetch_factor, smaller batches, "
        "smaller or lazily decoded samples; check `dmesg` (or the container's memory limit) for the OOM kill. "
        "num_workers=0 makes the failing sample fail in the rank's own process, at the dataset's line."),
    "DDP204.worker-shm": (
        "The workers pass batches through /dev/shm: make it larger (Docker: `--shm-size`; `ddp-doctor check` "
        "measures it, DDP504), or use fewer workers / a smaller prefetch_factor."),
    "DDP204.worker-signal": (
        "Find who sent the signal to the worker (a crash in native code of the dataset or its libraries, a "
        "scheduler, a user); num_workers=0 runs the same code in the rank's own process, with a traceback."),
    "DDP204.worker-exit": (
        "The worker exited on its own (sys.exit / os._exit in the dataset or its libraries): run with "
        "num_workers=0 to see the error in the rank's own process."),
    "DDP204.node-lost": (
        "Find out why that node's launcher ended: the out-of-memory killer (`dmesg` on that host), the "
        "scheduler (preemption, a time limit, a node failure in its log), a user. Its ranks die with it; the "
        "job can only go on from a checkpoint (or with torchrun's --max-restarts on the remaining nodes)."),
    "DDP204.unknown": (
        "Look at the ranks' stderr."),
    "DDP205.stall": (
        "Look at the line shown: a DataLoader worker blocked on I/O or a lock, a dataset __getitem__ that"
        " never returns, or a rank waiting on a file/queue another rank never fills. Set "
        "DataLoader(timeout=...) so a stuck worker raises instead of hanging."),
    "DDP205.pg-timeout": (
        "The rank shown keeps the others waiting in a collective longer than the process group's timeout"
        " allows: move the slow work out of the window between collectives, run it on every rank, or"
        " raise init_process_group(timeout=...) for this job."),
    "DDP205.slow": (
        "Nothing to fix if the wait is expected (a remote call, an evaluation on one rank). Otherwise do the"
        " slow work on every rank or outside the window between collectives, so the others do not idle."),
    "DDP205.outside": (
        "The rank waits on something outside the job (shown: a service's address, a child process, a file). If "
        "that wait is expected, nothing to fix: ddp-doctor keeps watching (pass --stop-on-stall to stop at the "
        "limit instead). Otherwise give the call a timeout (socket.settimeout, subprocess.run(timeout=...)), or do "
        "the slow work outside the window between collectives so the other ranks do not wait in them."),
    "DDP205.transport": (
        "Check the interconnect and the other nodes' logs; run `ddp-doctor check`."),
    "DDP301": (
        "Load with map_location set to this rank's device: torch.load(path, map_location=f'cuda:{local_rank}') or "
        "ddp_doctor.fixes.load_checkpoint(path)."),
    "DDP302": (
        "Call torch.cuda.set_device(local_rank) first thing (before any .cuda(), torch.cuda call, or library that "
        "touches CUDA), and use explicit devices: ddp_doctor.fixes.local_device()."),
    "DDP403": (
        "Pass persistent_workers=True to the DataLoader (workers, and their dataset copies, then live for the whole "
        "run; call sampler.set_epoch() as usual)."),
    "DDP405": (
        "Construct DDP with find_unused_parameters=False (the default). Keep True only if some inputs skip "
        "parameters (then DDP raises a clear error telling you so)."),
    "DDP510": (
        "Let every process join the launcher's group: call `init_process_group(backend)` without `world_size=`/"
        "`rank=` (torchrun and `ddp-doctor run` set WORLD_SIZE, RANK, MASTER_ADDR and MASTER_PORT). If the "
        "processes are meant to be independent, launch them separately instead."),
    "DDP510.unused": (
        "With accelerate on CPU set ACCELERATE_USE_CPU=1 (or `accelerate launch --cpu`, `Accelerator(cpu=True)`);"
        " in a plain script call `init_process_group(backend)`, wrap the model in DDP and give the DataLoader a "
        "DistributedSampler. If the processes are meant to be independent, launch them separately instead."),
    # ddp-doctor check (DDP5xx; the environment audit's fixes are computed from what it measured)
    "DDP501.no-rank": (
        "Check that every node runs the same command with the same --nnodes and a --rdzv-endpoint "
        "every node can reach (no localhost on multi-node), and that the port is free."),
    "DDP501.not-joined": (
        "Check the rank's host can reach MASTER_ADDR:MASTER_PORT (firewall, GLOO_SOCKET_IFNAME / "
        "NCCL_SOCKET_IFNAME), and that its environment imports torch."),
    "DDP204.check-exit": (
        "Read the rank's log below; SIGKILL usually means the OOM killer (dmesg | grep -i oom)."),
    "DDP508": (
        "Run every node from the same image / lock file (same torch, CUDA, NCCL, Python)."),
    "DDP509": (
        "Call torch.cuda.set_device(int(os.environ['LOCAL_RANK'])) first, and do not give every rank the "
        "same CUDA_VISIBLE_DEVICES."),
    "DDP502.hung": (
        "Look at that rank's host and device first (its log, nvidia-smi, dmesg); "
        "run NCCL_DEBUG=INFO ddp-doctor check for the backend's view."),
    "DDP503.pair": (
        "Re-run with NCCL_P2P_DISABLE=1: if the data becomes right, the peer-to-peer path "
        "between these two devices is at fault (ACS/IOMMU, driver)."),
    "DDP502.pair": (
        "One pair failing while the others pass points to that path: try NCCL_P2P_DISABLE=1 "
        "once to confirm, then check `nvidia-smi topo -m`, ACS/IOMMU and the NICs."),
    "DDP502.collective": (
        "If every rank fails, suspect the backend/network configuration (interface, firewall); "
        "if a few, their hosts or devices. Re-run with a larger --deadline to rule out slowness."),
    "DDP503": (
        "Test the named rank's device alone (memory test, nvidia-smi -q ECC), then re-run with "
        "NCCL_P2P_DISABLE=1: if that fixes it, the peer-to-peer path is at fault."),
    "DDP501.stale-store": (
        "Launch with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in the environment (for `ddp-doctor run` and "
        "for torchrun alike): each attempt then gets a fresh store and the restart connects."),
}


def runtime_fix(key: str) -> str:
    """The fix text of a runtime code (``"DDP201"``) or of one of its cases (``"DDP204.oom"``)."""
    return RUNTIME_FIXES[key]


def info(code: str) -> CodeInfo:
    """The catalogue entry for ``code``; KeyError names an unknown code."""
    try:
        return CATALOGUE[code]
    except KeyError:
        raise KeyError(f"unknown finding code {code!r}") from None


@dataclass
class Location:
    """Where a finding points: a source line (1-based) and, when known, columns and function."""

    path: str
    line: int
    function: str | None = None
    column: int | None = None  # 1-based, as editors show it
    end_line: int | None = None
    end_column: int | None = None

    def to_report_dict(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "function": self.function}


@dataclass
class Finding:
    """One reported hazard, static or runtime.

    ``message`` says what goes (or went) wrong and where; ``fix`` says what to
    write instead.  ``ranks`` and ``evidence`` are filled by runtime diagnoses.
    """

    code: str
    message: str
    fix: str
    location: Location | None = None
    severity: Severity | None = None  # None: the catalogue default
    ranks: list[int] = field(default_factory=list)
    evidence: dict[str, Any] = field(default_factory=dict)
    title: str | None = None  # None: the catalogue title

    def __post_init__(self) -> None:
        entry = info(self.code)
        if self.severity is None:
            self.severity = entry.severity
        else:
            self.severity = Severity(self.severity)
        if self.title is None:
            self.title = entry.title

    @property
    def name(self) -> str:
        return info(self.code).name

    def to_lint_dict(self) -> dict[str, Any]:
        """The ``ddp-doctor/lint/v1`` finding object (DESIGN.md)."""
        loc = self.location
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "path": loc.path if loc else None,
            "line": loc.line if loc else None,
            "column": loc.column if loc else None,
            "end_line": loc.end_line if loc else None,
            "end_column": loc.end_column if loc else None,
            "message": self.message,
            "fix": self.fix,
        }

    def to_report_dict(self) -> dict[str, Any]:
        """The ``ddp-doctor/report/v1`` finding object (DESIGN.md)."""
        return {
            "code": self.code,
            "name": self.name,
            "severity": self.severity.value,
            "title": self.title,
            "message": self.message,
            "ranks": sorted(self.ranks),
            "location": self.location.to_report_dict() if self.location else None,
            "evidence": plain(self.evidence),
            "fix": self.fix,
        }

    @classmethod
    def from_report_dict(cls, data: dict[str, Any]) -> "Finding":
        """Inverse of :meth:`to_report_dict` (for re-rendering a saved report)."""
        loc = data.get("location")
        return cls(
            code=data["code"],
            message=data.get("message", ""),
            fix=data.get("fix", ""),
            location=Location(loc["path"], loc["line"], loc.get("function")) if loc else None,
            severity=data.get("severity"),
            ranks=list(data.get("ranks", [])),
            evidence=dict(data.get("evidence", {})),
            title=data.get("title"),
        )


def plain(value: Any) -> Any:
    """``value`` as JSON-able data: records (anything with ``to_json``) rendered, containers walked."""
    if hasattr(value, "to_json"):
        return value.to_json()
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [plain(v) for v in value]
    return value
