"""What the program made before the probe was installed (``ddp_doctor.watch()`` called after
``init_process_group``): its DDP models and DataLoaders, put on record as if the hooks had seen them made.
The group itself is adopted by :func:`ddp_doctor.probe.groups.adopt`."""
from __future__ import annotations

from ddp_doctor.probe import hooks


def adopt_existing() -> None:
    """The probe installed after the program made its DDP models and DataLoaders (``ddp_doctor.watch()``
    after ``init_process_group``): put them on record as if the hooks had seen them made.  One scan of
    the garbage collector's objects, only in that case."""
    import gc

    try:
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader
    except Exception:
        return
    for obj in gc.get_objects():
        try:
            kind = type(obj)  # (isinstance() would ask some objects for __class__: torch warns on a few)
            if issubclass(kind, DDP) and "_ddpd_rec" not in obj.__dict__:
                hooks.note_ddp(obj, None)
            elif issubclass(kind, DataLoader) and getattr(obj, "_ddpd_rec", None) is None:
                hooks.note_loader(obj, None)
        except Exception:
            pass
