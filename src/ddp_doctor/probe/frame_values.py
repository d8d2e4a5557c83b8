"""The plain values a rank's innermost user frames hold, read only when the watcher asks for stacks.

They answer "why did the ranks part?": the values of a rank-varying condition's names (``val_loss``,
``len(batch)``'s ``batch``, ``self.rank``) on each rank, shown beside the decision the diagnosis blames.

Why only then: ``sys._current_frames()`` hands this thread references to the main thread's frames, and a
frame kept after the main thread returned from it would free the user's locals (a DDP model, CUDA tensors)
in this thread.  The watcher asks once a verdict is decided or the job is interrupted -- the main thread is
then blocked in the call it is stuck in -- and every reference is dropped before returning.  Nothing of
the user's runs: only builtin values are rendered, tensors by dtype and shape (their value when a CPU
scalar: no CUDA sync on a hung device), objects by the plain values in their instance ``__dict__``.
"""
from __future__ import annotations

import types

from ddp_doctor import frames as kinds
from ddp_doctor.evidence import FrameValues, Site
from ddp_doctor.probe.stackdump import held_frames

MAX_FRAMES = 6      # innermost user frames read
MAX_VALUES = 40     # values per frame
MAX_ATTRS = 12      # plain attributes per object (``self.rank``, ``args.local_rank``)
MAX_STR = 40        # characters of a string value
_SKIP_TYPES = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType, type)


def user_frame_values(thread_id: int) -> tuple[FrameValues, ...]:
    """The innermost user frames of thread ``thread_id`` (innermost first) with their plain values."""
    out: list[FrameValues] = []
    try:
        with held_frames() as frames:
            f = frames.get(thread_id)
            while f is not None and len(out) < MAX_FRAMES:
                code = f.f_code
                if kinds.is_user(code.co_filename):
                    out.append(FrameValues(Site(code.co_filename, f.f_lineno, code.co_name), plain_values(f.f_locals)))
                f = f.f_back
            f = None
    except Exception:  # noqa: BLE001 - values are an aid: a frame that cannot be read gives none
        pass
    return tuple(out)


def plain_values(local_vars: dict) -> tuple[tuple[str, str], ...]:
    """(name, short repr) of the plain locals, then of the plain attributes of the object locals."""
    plain, objects = [], []
    for name, v in list(local_vars.items()):
        if name.startswith("__"):
            continue
        text = render(v)
        if text is not None:
            plain.append((name, text))
        elif not isinstance(v, _SKIP_TYPES):
            objects.append((name, v))
    for name, obj in objects:
        if len(plain) >= MAX_VALUES:
            break
        plain += _attrs(name, obj)
    return tuple(plain[:MAX_VALUES])


def _attrs(name: str, obj) -> list[tuple[str, str]]:
    try:
        d = object.__getattribute__(obj, "__dict__")
    except Exception:  # noqa: BLE001 - no instance dict (slots, builtins)
        return []
    if type(d) is not dict:
        return []
    out = []
    for k, v in list(d.items()):
        if isinstance(k, str) and not k.startswith("_"):
            text = render(v)
            if text is not None:
                out.append((f"{name}.{k}", text))
                if len(out) >= MAX_ATTRS:
                    break
    return out


def render(v) -> str | None:
    """A short repr of a plain value; None for anything whose repr could run user code."""
    t = type(v)
    if v is None or t in (bool, int):
        return repr(v)
    if t is float:
        return f"{v:.6g}"
    if t is str:
        return repr(v if len(v) <= MAX_STR else v[:MAX_STR - 3] + "...")
    if t in (list, tuple, dict, set, frozenset):
        return f"{t.__name__} of {len(v)}"
    if t.__module__ in ("torch", "torch.nn.parameter") and t.__name__ in ("Tensor", "Parameter"):
        return _tensor(v)
    if t.__module__ == "numpy" and getattr(v, "shape", None) == ():
        try:
            return f"{v.item():.6g}" if isinstance(v.item(), float) else repr(v.item())
        except Exception:  # noqa: BLE001
            return None
    return None


def _tensor(v) -> str | None:
    try:
        dtype = str(v.dtype).replace("torch.", "")
        if v.device.type == "cpu" and v.numel() == 1:
            x = v.item()
            return f"tensor({x:.6g})" if isinstance(x, float) else f"tensor({x!r})"
        return f"tensor {dtype} [{', '.join(map(str, v.shape))}] on {v.device}"
    except Exception:  # noqa: BLE001 - a tensor subclass or a meta tensor: no value
        return None
