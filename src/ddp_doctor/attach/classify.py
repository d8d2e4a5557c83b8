"""What a rank is doing, read from its main thread's Python stack: inside which collective, or where outside.

The stack is the only evidence ``attach`` has (no probe ran in the job), so the classification
reads torch's own frames: the collective function ``evidence.ops.collective_frame`` names (an object
collective such as ``all_gather_object`` rather than the ``all_gather`` it calls), DDP's
constructor / forward (parameter and buffer broadcasts), the autograd engine (DDP's gradient
all-reduce runs while the main thread waits in ``backward()``), a DataLoader waiting for a batch.
The site is the innermost *user* frame: torch, ddp_doctor and installed packages are skipped.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from ddp_doctor import frames as _frames
from ddp_doctor.diagnose.common import user_frame, where
from ddp_doctor.evidence import Collective, Site
from ddp_doctor.evidence import ops
from ddp_doctor.evidence.ops import OBJECT_COLLECTIVES

DDP_FILE = os.path.join("nn", "parallel", "distributed.py")


def is_user(f: Site) -> bool:
    """A frame of the user's code: not ddp-doctor, torch, the standard library or an installed package."""
    return _frames.is_user(f.path)


@dataclass(frozen=True)
class StackActivity:
    """Where a rank is: ``kind`` collective | object_collective | ddp | data | outside | no_python."""

    kind: str
    op: str | None
    site: Site | None

    @property
    def in_collective(self) -> bool:
        return self.kind in ("collective", "object_collective", "ddp")

    @property
    def explicit(self) -> bool:
        """A collective the user's code calls itself (not one DDP issues)."""
        return self.kind in ("collective", "object_collective")

    def key(self) -> tuple:
        return (self.kind, self.op, self.site.path if self.site else None, self.site.line if self.site else None)

    def describe(self) -> str:
        at = where(self.site)
        if self.in_collective:
            return f"waits in {self.op} at {at}"
        if self.kind == "data":
            return f"waits for a batch from its DataLoader at {at}"
        if self.kind == "no_python":
            return "has no Python stack (finished, or inside the interpreter's start-up/shut-down)"
        return f"is at {at}" + (f" (inside {self.op})" if self.op else "")


def to_collective(a: StackActivity) -> Collective | None:
    """The adapter to the shared policy: the collective a rank stands in, as the run path records one.  A stack
    shows no position (group, sequence number) and no tensors: ``diagnose.blame`` then tells calls apart by
    op and line."""
    if not a.in_collective or a.op is None:
        return None
    return Collective(None, None, a.op, site=a.site, origin="ddp" if a.kind == "ddp" else "user")


def _name(f: Site) -> str:
    return ops.op_name(f.function)


def classify(stack) -> StackActivity:
    """The activity of one thread's stack (outermost first)."""
    if not stack:
        return StackActivity("no_python", None, None)
    site = user_frame(stack)
    inside = ops.collective_frame(stack)  # the outermost: all_gather_object, not the all_gather inside it
    if inside is not None:
        op = inside[0]
        return StackActivity("object_collective" if op in OBJECT_COLLECTIVES else "collective", op, site)
    for f in stack:
        if f.path.endswith(DDP_FILE):
            if _name(f) == "__init__":
                return StackActivity("ddp", "ddp.init(broadcast_params)", site)
            if _name(f) in ("forward", "_pre_forward", "_sync_buffers", "_sync_module_buffers",
                              "_default_broadcast_coalesced", "_distributed_broadcast_coalesced"):
                return StackActivity("ddp", "ddp.forward(broadcast_buffers)", site)
    for f in stack:
        if _name(f) in ("_engine_run_backward", "run_backward") or (
                _name(f) == "backward" and os.sep + "autograd" + os.sep in f.path):
            return StackActivity("ddp", "ddp.backward(allreduce_grads)", site)
    for f in stack:
        if f.path.endswith(os.path.join("utils", "data", "dataloader.py")) and _name(f) in (
                "__next__", "_next_data", "_get_data", "_try_get_data"):
            return StackActivity("data", "DataLoader.__next__", site)
    inner = stack[-1]
    lib = None if is_user(inner) else f"{os.path.basename(inner.path)}:{inner.line} {inner.function}"
    return StackActivity("outside", lib, site)
