"""Point-to-point calls (send / recv / isend / irecv / batch_isend_irecv) and the pipeline schedules that
issue them.

They pair by peer, not by a group's sequence, so they are not numbered with the collectives (a send paired
with a recv is no mismatch): the probe counts them per line in ``site_counts`` (ops "p2p.*", the API they
were issued inside on the site), and counts each call of a pipeline schedule's ``step`` ("api.step"), so
that a hang inside a schedule can say which stage ran it more often.  The schedules are hooked at the first
point-to-point call (the user's program has imported them by then); the step in progress counts.
"""
from __future__ import annotations

import functools
import sys
import threading

from ddp_doctor.apis import BY_NAME, STEP_OP
from ddp_doctor.evidence.ops import P2P
from ddp_doctor.probe.apisite import user_site_api

_SCHEDULES = ("PipelineScheduleSingle", "PipelineScheduleMulti")
_STEP_NAMES = {a.name for a in BY_NAME.values() if a.qualname.endswith(".step") and "pipelining" in a.path}
_tls = threading.local()
_schedules_hooked = False


def _count(rec, op: str, frame) -> tuple | None:
    site = user_site_api(frame)
    key = (op, rec.site_index(site))
    rec.site_counts[key] = rec.site_counts.get(key, 0) + 1
    return site


def _split(rec, site_idx: int, schedule) -> None:
    """The micro-batch count of the schedule whose step the rank runs at ``site_idx``."""
    n = getattr(schedule, "_n_microbatches", None)
    if isinstance(n, int):
        rec.microbatches[site_idx] = n


def _running_schedule(frame):
    """The schedule whose ``step`` is running on this thread, from its frames (the step in progress when the
    schedules were hooked)."""
    while frame is not None:
        me = frame.f_locals.get("self") if frame.f_code.co_name == "step" else None
        if me is not None and hasattr(me, "_n_microbatches"):
            return me
        frame = frame.f_back
    return None


def _hook_schedules(rec_of, site) -> None:
    """Count the calls of the schedules' ``step`` from now on; the one in progress (``site`` is inside it)."""
    global _schedules_hooked
    _schedules_hooked = True
    mod = sys.modules.get("torch.distributed.pipelining.schedules")
    if mod is None:
        return
    for name in _SCHEDULES:
        cls = getattr(mod, name, None)
        orig = getattr(cls, "step", None)
        if orig is None or hasattr(orig, "__ddp_doctor_wrapped__"):
            continue

        @functools.wraps(orig)
        def step(self, *args, _orig=orig, **kwargs):
            if not getattr(_tls, "step", 0):
                try:
                    rec = rec_of()
                    site = _count(rec, STEP_OP, sys._getframe(1))
                    _split(rec, rec.site_index(site), self)
                except Exception:
                    pass
            _tls.step = getattr(_tls, "step", 0) + 1
            try:
                return _orig(self, *args, **kwargs)
            finally:
                _tls.step -= 1

        step.__ddp_doctor_wrapped__ = orig
        cls.step = step
    if site is not None and len(site) > 3 and site[3] in _STEP_NAMES:
        rec = rec_of()
        key = (STEP_OP, rec.site_index(site[:3]))
        rec.site_counts[key] = rec.site_counts.get(key, 0) + 1
        _split(rec, key[1], _running_schedule(sys._getframe(1)))


def _wrap(fn, op: str, rec_of):
    @functools.wraps(fn)
    def p2p(*args, **kwargs):
        if not getattr(_tls, "depth", 0):
            try:
                site = _count(rec_of(), "p2p." + op, sys._getframe(1))
                if not _schedules_hooked:
                    _hook_schedules(rec_of, site)
            except Exception:
                pass
        _tls.depth = getattr(_tls, "depth", 0) + 1
        try:
            return fn(*args, **kwargs)
        finally:
            _tls.depth -= 1

    p2p.__ddp_doctor_wrapped__ = fn
    return p2p


def patch(rec_of) -> None:
    """Wrap each point-to-point call (and its ``torch.distributed`` alias); ``rec_of()``: the Recorder."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    for op in P2P:
        fn = getattr(c10d, op, None)
        if fn is None or hasattr(fn, "__ddp_doctor_wrapped__"):
            continue
        wrapped = _wrap(fn, op, rec_of)
        setattr(c10d, op, wrapped)
        if getattr(dist, op, None) is fn:
            setattr(dist, op, wrapped)
