"""Which launcher started the ranks, as rank 0 sees it (its environment and imported modules), and where
the embedded watcher's report goes.  Named in the report (``launcher``) so a reader knows how the job ran.

A launcher that starts ranks through another (accelerate and Lightning under torchrun, the HF Trainer
under anything) is named by the outer one plus the framework, e.g. "torchrun (accelerate)".
"""
from __future__ import annotations

import os
import sys

REPORT_NAME = "ddp-doctor-report.json"


def _framework() -> str | None:
    mods = sys.modules
    if "lightning" in mods or "pytorch_lightning" in mods or "lightning_fabric" in mods:
        return "lightning"
    if "accelerate" in mods and "transformers" not in mods:
        return "accelerate"
    if "transformers.trainer" in mods:
        return "transformers Trainer"
    if "accelerate" in mods:
        return "accelerate"
    return None


def detect() -> str:
    """A short name: "torchrun", "accelerate launch", "accelerate notebook_launcher", "lightning (subprocess)",
    "lightning (ddp_spawn)", "ray train", "torch.multiprocessing", "mpirun", "srun", "environment" (RANK,
    WORLD_SIZE... set by hand or by a launcher not known here); "torchrun (lightning)", "accelerate launch
    (transformers Trainer)" etc. for a framework under a launcher (Fabric's is lightning's)."""
    env = os.environ
    framework = _framework()
    if "ray.train" in sys.modules:
        return "ray train"
    if env.get("TORCHELASTIC_RUN_ID"):
        if env.get("ACCELERATE_MIXED_PRECISION") or env.get("ACCELERATE_DYNAMO_BACKEND"):
            return "accelerate launch" + (f" ({framework})" if framework not in (None, "accelerate") else "")
        if env.get("NPROC") and "accelerate" in sys.modules:
            return "accelerate notebook_launcher"
        return "torchrun" + (f" ({framework})" if framework else "")
    spawned = _spawned()
    if framework == "lightning":
        return "lightning (ddp_spawn)" if spawned else "lightning (subprocess)"
    if spawned:
        return "torch.multiprocessing" + (f" ({framework})" if framework else "")
    outer = ("mpirun" if env.get("OMPI_COMM_WORLD_SIZE") or env.get("PMI_SIZE") or env.get("PMIX_RANK")
             else "srun" if env.get("SLURM_PROCID") else "environment")
    return outer + (f" ({framework})" if framework else "")


def _spawned() -> bool:
    import multiprocessing

    return multiprocessing.parent_process() is not None


def launch_dir() -> str:
    """The directory the user launched from: the working directory, except in a Ray Train worker, which Ray
    moved into its own working directory; there the ``PWD`` the workers inherited from the driver's shell
    (a local Ray started by the driver passes its environment on)."""
    cwd = os.getcwd()
    pwd = os.environ.get("PWD")
    if "ray" in sys.modules and pwd and os.path.isdir(pwd):
        return pwd
    return cwd


def report_path(env: str = "DDP_DOCTOR_REPORT", default: str | None = REPORT_NAME) -> str | None:
    """The absolute path of an embedded watcher's report: ``$env`` (relative to the launch directory), else
    ``default`` there (None: no such report)."""
    path = os.environ.get(env) or default
    return None if not path else os.path.abspath(os.path.join(launch_dir(), os.path.expanduser(path)))
