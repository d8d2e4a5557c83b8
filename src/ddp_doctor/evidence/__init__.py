"""The typed runtime evidence: what a rank's probe publishes, what the watcher adds, what diagnose reads.

These frozen records ARE the wire format.  The probe builds a :class:`RankState` at publish time (its
hot path keeps tuples) and sends ``to_json()``; the watcher reads it back with ``RankState.from_json``,
adds what only the launcher side knows (stacks, exit status, busy, the sites a rank ever ran) and
hands a :class:`JobEvidence` plus the live :class:`Verdict` to ``diagnose``; the session renders the
records into the user-facing ``ddp-doctor/report/v1`` document with ``to_json()``.  No other module
knows a key of this format: a key written here and read elsewhere under another name (the bug this
module was made for: ``shapes`` published, ``shape`` rendered) cannot happen.

Wire details kept compact (published 4x a second): collective fingerprints and per-site call counts
reference a shared ``sites`` table by index.  ``SCHEMA`` is posted with every state; a state of
another schema is ignored by the watcher rather than misread.

Several nodes: each node's agent reduces its ranks' states to a :class:`NodeSummary` (``summary.py``), posted
in the compact delta encoding of ``compact.py``; the root pulls :class:`NodeDetail` (full states) only from
the nodes it suspects, through a :class:`Control` message.

``RankState.perf`` holds the performance family's records (``loads``, ``cuda``, ``gpu``, ``h2d``,
``loadavg``, ``cpu_count``): written by ``probe/perf.py``, read by ``diagnose/perf.py`` only.
"""
from ddp_doctor.evidence.agreement import GROUP_CREATION, ROOT
from ddp_doctor.evidence.job import (EVIDENCE_OUT_ENV, Capture, JobEvidence, LintMark, NodeLoss, Suspicion, Verdict,
                                     exit_from_wire, rank_state_from_wire, stacks_from_wire, to_wire)
from ddp_doctor.evidence.outside import OutsideWait, Stall
from ddp_doctor.evidence.rank import PERF_KEYS, RankState, missing_rank
from ddp_doctor.evidence.records import (SCHEMA, Activity, Collective, DataWait, DdpModel, DdpParam,
                                         ExitStatus, GroupInit, LoaderState, Microbatches, RaisedError, Refused, SamplerState, Site,
                                         SiteCount, SkippedSync, TimelineEvent, Timing, WorkerExit)
from ddp_doctor.evidence.threads import FrameValues, ThreadStack, WorkerStack, stacks_from_json, stacks_to_json
from ddp_doctor.evidence.summary import (Control, Deadline, Digests, Finished, NodeDetail, NodeSummary, Outside, Pull,
                                         Waiting, rank_runs)

__all__ = ["GROUP_CREATION", "ROOT", "SCHEMA", "PERF_KEYS", "EVIDENCE_OUT_ENV", "Activity", "Site", "Collective", "ExitStatus",
           "RaisedError", "DataWait", "SamplerState", "LoaderState", "DdpModel", "DdpParam", "GroupInit", "Timing",
           "TimelineEvent", "ThreadStack", "FrameValues", "WorkerExit", "WorkerStack", "SkippedSync",
           "SiteCount", "Microbatches", "Refused", "RankState", "missing_rank", "LintMark", "JobEvidence", "Suspicion", "Verdict", "Capture", "to_wire",
           "NodeLoss", "NodeSummary", "Waiting", "Outside", "Finished", "Deadline", "Digests", "Control", "Pull",
           "NodeDetail", "rank_runs", "OutsideWait", "Stall",
           "rank_state_from_wire", "exit_from_wire", "stacks_from_wire", "stacks_to_json", "stacks_from_json"]
