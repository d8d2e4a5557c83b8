"""ddp-doctor: find, explain and prevent the failures that hang, desync or slow PyTorch DDP training."""

from ddp_doctor.version import __version__

__all__ = ["__version__", "watch"]


def watch() -> bool:
    """Watch this distributed job: one call at the top of the training file, under any launcher.

    Installs ddp-doctor's probe in this rank; rank 0 hosts the watcher, which names the rank and line of a
    hang, desync or crash, writes the report and stops the job.  In a process that is not a rank yet
    (Lightning's ``python train.py``, ``mp.spawn``, ``notebook_launcher``, a Ray Train driver) it arms itself
    and activates when the process group forms (:mod:`ddp_doctor.probe.arm`); a process that never becomes
    a rank pays nothing.  Safe to call twice; a no-op (True) under ``ddp-doctor run``.  True when this
    process is watched now, False when it armed.
    """
    from ddp_doctor.probe.__main__ import watch as _watch

    return _watch()

