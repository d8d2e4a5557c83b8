"""The lint rules: one class per finding code, registered once, in :data:`RULES`."""
from __future__ import annotations

from ddp_doctor.lint.rules.base import Context, Rule
from ddp_doctor.lint.rules.collectives import DDPForwardOnSubset, RankConditionalCollective
from ddp_doctor.lint.rules.checkpoints import SaveOnEveryRank
from ddp_doctor.lint.rules.collate import CollateMayReturnNone
from ddp_doctor.lint.rules.ddp import BatchNormWithoutSyncBN, FindUnusedParameters
from ddp_doctor.lint.rules.devices import CudaBeforeSetDevice, LoadWithoutMapLocation
from ddp_doctor.lint.rules.launch import LaunchNotAtEntry
from ddp_doctor.lint.rules.loader_perf import DataBound, LoaderWithoutPinMemory, WorkersNotPersistent
from ddp_doctor.lint.rules.samplers import LoaderWithoutDistributedSampler, SamplerEpochNotSet, ShuffleWithSampler
from ddp_doctor.lint.rules.steps import UnevenSteps

#: Every lint rule, in code order.  Adding a rule = one class + one line here.
RULES: list[type[Rule]] = [
    UnevenSteps,                      # DDP101
    SamplerEpochNotSet,               # DDP102
    ShuffleWithSampler,               # DDP103
    CollateMayReturnNone,             # DDP104
    LoaderWithoutDistributedSampler,  # DDP105
    RankConditionalCollective,        # DDP201
    DDPForwardOnSubset,               # DDP202
    LaunchNotAtEntry,                 # DDP206
    LoadWithoutMapLocation,           # DDP301
    CudaBeforeSetDevice,              # DDP302
    SaveOnEveryRank,                  # DDP303
    DataBound,                        # DDP401
    LoaderWithoutPinMemory,           # DDP402
    WorkersNotPersistent,             # DDP403
    FindUnusedParameters,             # DDP405
    BatchNormWithoutSyncBN,           # DDP406
]

RULE_CODES: list[str] = [r.code for r in RULES]

__all__ = ["RULES", "RULE_CODES", "Rule", "Context"]
