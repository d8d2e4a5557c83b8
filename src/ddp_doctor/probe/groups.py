"""The probe's view of the process groups themselves: the default group's timeout (a collective that waits
that long fails the job anyway, so the watcher may stop it just before, with every rank's stack) and DDP's
``Join`` contexts (inside one, ranks legitimately run different numbers of steps and collectives).

Join: the ranks that ran out of inputs shadow the others' collectives from ``Join.__exit__`` (partly
through DDP's reducer, which the probe does not see), so inside a Join the ranks' collectives cannot be
compared position by position, and afterwards their sequence numbers on the Join's group no longer
line up.  Collectives issued inside a Join are marked ``join``, training epochs that ran under one are
marked too, and when the context ends every rank restarts that group's numbering at the same new
"era" (the Join count times ``ERA``): every rank leaves each Join together, so they agree again.
"""
from __future__ import annotations

import functools

ERA = 1_000_000_000


def install(rec) -> None:
    _patch_init(rec)
    _patch_join(rec)


def _patch_join(rec) -> None:
    from torch.distributed.algorithms.join import Join

    if hasattr(Join.__exit__, "__ddp_doctor_wrapped__"):
        return
    orig_enter, orig_exit = Join.__enter__, Join.__exit__

    @functools.wraps(orig_enter)
    def __enter__(self):
        out = orig_enter(self)
        if getattr(self, "_enable", True):
            rec.join_depth += 1
            rec.version += 1
        return out

    @functools.wraps(orig_exit)
    def __exit__(self, *exc):
        enabled = getattr(self, "_enable", True)
        try:
            return orig_exit(self, *exc)
        finally:
            if enabled:
                rec.join_depth = max(0, rec.join_depth - 1)
                rec.join_exits += 1
                if exc[0] is None:
                    try:
                        from ddp_doctor.probe.hooks import _group_key

                        rec.seq[_group_key(self._process_group)] = rec.join_exits * ERA
                    except Exception:
                        pass
                rec.version += 1

    __exit__.__ddp_doctor_wrapped__ = orig_exit
    Join.__enter__, Join.__exit__ = __enter__, __exit__


def _patch_init(rec) -> None:
    """Note the default process group's timeout: a collective that waits that long fails the job anyway."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    orig = c10d.init_process_group
    if hasattr(orig, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        out = orig(*args, **kwargs)
        try:
            timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
            if timeout is None:
                timeout = c10d._get_default_timeout(dist.get_backend())
            rec.pg_timeout_s = float(timeout.total_seconds())
            rec.version += 1
        except Exception:
            pass
        return out

    init_process_group.__ddp_doctor_wrapped__ = orig
    c10d.init_process_group = init_process_group
    if getattr(dist, "init_process_group", None) is orig:
        dist.init_process_group = init_process_group
