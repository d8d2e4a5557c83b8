"""The default process group a rank joined: its size and rank as torch saw them, and where it was made.

Launched with N processes, each one may still initialise a group of its own (``world_size=1`` /
``rank=0`` written into the script, accelerate on CPU without ``ACCELERATE_USE_CPU=1``): every process
then trains alone on the whole data.  The launcher's WORLD_SIZE says N; only the group says 1.
"""
from __future__ import annotations

import functools
import sys
import threading

from ddp_doctor.probe.recorder import user_site


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


def patch_init(rec) -> None:
    """Wrap ``init_process_group``: the user's call is made unchanged, then the group is recorded."""
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
        return out

    init_process_group.__ddp_doctor_wrapped__ = orig
    c10d.init_process_group = init_process_group
    if getattr(dist, "init_process_group", None) is orig:
        dist.init_process_group = init_process_group
