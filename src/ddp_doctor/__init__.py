"""ddp-doctor: find, explain and prevent the failures that hang, desync or slow PyTorch DDP training."""

__version__ = "0.1.0"


def watch() -> bool:
    """Watch this rank of a distributed job: one call near the top of the training script, or inside the
    function a launcher runs per rank (before or after ``init_process_group``).

    Installs ddp-doctor's probe in this process; rank 0 hosts the watcher, which names the rank and line
    of a hang, desync or crash, writes the report and stops the job.  Safe to call twice; a no-op (True)
    under ``ddp-doctor run``; a no-op (False) in a process that is not a rank of a job of several.
    """
    from ddp_doctor.probe.__main__ import watch as _watch

    return _watch()

