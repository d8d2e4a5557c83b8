"""The probe's view of the process groups themselves.

* The default group a rank joined: its size and rank as torch saw them, where it was made, and its
  timeout.  Launched with N processes, each one may still initialise a group of its own
  (``world_size=1`` / ``rank=0`` written into the script, accelerate on CPU without
  ``ACCELERATE_USE_CPU=1``): every process then trains alone on the whole data; the launcher's
  WORLD_SIZE says N, only the group says 1.  A collective that waits as long as the timeout fails the
  job anyway, so the watcher may stop it just before, with every rank's stack.
* DDP's ``Join`` contexts: the ranks that ran out of inputs shadow the others' collectives from
  ``Join.__exit__`` (partly through DDP's reducer, which the probe does not see), so inside a Join the
  ranks' collectives cannot be compared position by position, and afterwards their sequence numbers
  on the Join's group no longer line up.  Collectives issued inside a Join are marked ``join``,
  training epochs that ran under one are marked too, and when the context ends every rank restarts
  that group's numbering at the same new "era" (the Join count times ``ERA``): every rank leaves each
  Join together, so they agree again.
"""
from __future__ import annotations

import functools
import os
import sys
import threading

from ddp_doctor import store as side
from ddp_doctor.probe.group_calls import group_key
from ddp_doctor.probe.recorder import user_site

ERA = 1_000_000_000

_after_init: list = []  # run once init_process_group returned (the probe's deferred connect)


def after_init(fn) -> None:
    """Call ``fn()`` after the user's ``init_process_group`` (exceptions in it are swallowed)."""
    _after_init.append(fn)


def adopt(rec) -> bool:
    """The default group made before the probe was installed (``ddp_doctor.watch()`` called after
    ``init_process_group``): record it and its timeout, and take this rank's place in it from torch where no
    launcher said (Lightning's ddp_spawn, ``mp.spawn`` set no RANK/WORLD_SIZE, its subprocess launch no
    RANK).  A RANK/WORLD_SIZE that was set is kept: a group of 1 under it is the misconfiguration the watcher reports.  True when a group exists."""
    dist = sys.modules.get("torch.distributed")
    try:
        if dist is None or not dist.is_available() or not dist.is_initialized():
            return False
    except Exception:
        return False
    try:
        if "RANK" not in os.environ:  # (Lightning's own launch sets WORLD_SIZE, not RANK)
            rec.rank = dist.get_rank()
        if "WORLD_SIZE" not in os.environ:
            rec.world_size = dist.get_world_size()
        note_group(rec)
        if rec.pg_timeout_s is None:
            import torch

            backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
            rec.pg_timeout_s = float(backend.options._timeout.total_seconds())
            rec.version += 1
    except Exception:
        pass
    return True


def install(rec) -> None:
    patch_init(rec)
    _patch_join(rec)
    _patch_destroy(rec)


def _patch_destroy(rec) -> None:
    """Note (and post at once) that the rank tears its process group down: gloo can abort the process in
    there ("terminate called without an active exception", torch's own teardown race) after the training
    completed, and the report must say so rather than blame the training."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    orig = c10d.destroy_process_group
    if hasattr(orig, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig)
    def destroy_process_group(*args, **kwargs):
        try:
            if not args and kwargs.get("group") is None:
                rec.teardown = True
                rec.version += 1
                _mark_teardown()
        except Exception:
            pass
        return orig(*args, **kwargs)

    destroy_process_group.__ddp_doctor_wrapped__ = orig
    c10d.destroy_process_group = destroy_process_group
    if getattr(dist, "destroy_process_group", None) is orig:
        dist.destroy_process_group = destroy_process_group


def note_group(rec, site=None) -> None:
    """Record the default group once it exists (from the init wrapper; the publisher's look catches an
    init the wrapper did not see, without a site).  In the rank's main thread (the init wrapper, the final
    post) also how many collectives the group itself has counted: DDP's, functional and library ones
    included, not only those the hooks see.  The publisher's thread touches the group only until it has
    seen it once: it must never hold the last reference to a process group being destroyed."""
    try:
        dist = sys.modules.get("torch.distributed")
        main = threading.current_thread() is threading.main_thread()
        if dist is None or (rec.group is not None and site is None and not main):
            return
        if not dist.is_available() or not dist.is_initialized():
            return
        if main:
            try:
                rec.group_colls = int(dist.distributed_c10d._get_default_group()._get_sequence_number_for_group())
            except Exception:
                pass
        if site is None and rec.group is not None:
            return
        rec.group = (dist.get_world_size(), dist.get_rank(), site, str(dist.get_backend()))
        rec.version += 1
    except Exception:
        pass


def _mark_teardown() -> None:
    """A file the launcher finds if this process then dies of a fatal signal (no post: waking the probe's
    thread to post while the group is torn down made gloo's teardown abort far more often)."""
    d = os.environ.get("DDP_DOCTOR_DIR")
    if d:
        open(side.teardown_file(d, os.getpid()), "w").close()


def patch_init(rec) -> None:
    """Wrap ``init_process_group``: the user's call is made unchanged, then the group and its timeout are
    recorded."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    orig = c10d.init_process_group
    if hasattr(orig, "__ddp_doctor_wrapped__"):
        return

    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        site = None
        try:
            site = user_site(sys._getframe(1))
        except Exception:
            pass
        out = orig(*args, **kwargs)
        note_group(rec, site)
        try:
            timeout = kwargs.get("timeout", args[2] if len(args) > 2 else None)
            if timeout is None:
                timeout = c10d._get_default_timeout(dist.get_backend())
            rec.pg_timeout_s = float(timeout.total_seconds())
            rec.version += 1
        except Exception:
            pass
        for fn in list(_after_init):
            try:
                fn()
            except Exception:
                pass
        return out

    init_process_group.__ddp_doctor_wrapped__ = orig
    c10d.init_process_group = init_process_group
    if getattr(dist, "init_process_group", None) is orig:
        dist.init_process_group = init_process_group


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
                        rec.seq[group_key(self._process_group)] = rec.join_exits * ERA
                    except Exception:
                        pass
                rec.version += 1

    __exit__.__ddp_doctor_wrapped__ = orig_exit
    Join.__enter__, Join.__exit__ = __enter__, __exit__
