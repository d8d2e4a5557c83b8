"""A collective call in words: its tensors' dtypes and shapes, and what differs between the ranks' calls at
one position (shared by the mismatch findings and their tests)."""
from __future__ import annotations

from ddp_doctor.evidence import ROOT, Collective
from ddp_doctor.diagnose.sizes import tensor_shapes


def _shape(s: str) -> str:
    """The probe's "10x3" as "[10, 3]"; a list of tensors "[4,4]" as "[4], [4]"."""
    if s.startswith("["):
        return ", ".join(_shape(x) if x != "..." else "..." for x in s[1:-1].replace("...", ",...").split(",") if x)
    return "[]" if s == "scalar" else "[" + ", ".join(s.split("x")) + "]"


def tensors_text(c: Collective) -> str:
    """A call's tensors in the user's words: "float32 [4]", a list as "list of float32 [50], [50]"."""
    parts = []
    for i, s in enumerate(c.shapes):
        if "=" in s:  # a size the probe recorded (split sizes, a list's length), not a tensor
            parts.append(s)
            continue
        dt = c.dtypes[i] if i < len(c.dtypes) else "?"
        parts.append(f"list of {dt} {_shape(s)}" if s.startswith("[") else f"{dt} {_shape(s)}")
    return " and ".join(parts)


def differs_text(calls: dict[int, Collective | None]) -> str:
    """" They pass different dtypes: rank 0: float32 [4], rank 1: float64 [4]." — each rank's tensors."""
    known = {r: c for r, c in calls.items() if c}
    if len({c.op for c in known.values()}) > 1 or len(known) < 2:
        return ""
    sigs = {r: (c.shapes, c.dtypes) for r, c in known.items() if c.shapes or c.dtypes}
    if not sigs:  # no tensors (a barrier), or none recorded: nothing to spell out
        return ""
    what = []
    if len({d for d in (dt for _sh, dt in sigs.values())}) > 1:
        what.append("dtypes")
    if len({tensor_shapes(known[r]) for r in sigs}) > 1:
        what.append("shapes")
    if len({tuple(x for x in sh if x.startswith(ROOT)) for sh, _dt in sigs.values()}) > 1:
        what.append("roots (src/dst: every rank must name the same one)")
    texts = {r: tensors_text(c) if r in sigs else "not recorded (the process died before its probe could post it)"
             for r, c in known.items()}
    sep = "; " if any("," in t for t in texts.values()) else ", "
    each = sep.join(f"rank {r}: {t}" for r, t in sorted(texts.items()))
    if what:
        return f" They pass different {' and '.join(what)}: {each}."
    return f" Their tensors: {each}." if len(sigs) < len(known) else ""
