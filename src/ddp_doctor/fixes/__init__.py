"""ddp_doctor.fixes -- the cures for the hazards ddp-doctor reports, one import each.

Standalone: imports only torch and the standard library, so training code can
use it without the rest of ddp-doctor.  Every helper that communicates is a
*collective*: call it on every rank, at the same point.  Without an initialised
process group (single process) they all behave like the plain local operation.

=========================  ==========================================  ===========
cure                       what it prevents                            code
=========================  ==========================================  ===========
``EvenBatches``            ranks running different numbers of steps    DDP101
``agree``                  a skip / stop decision taken on some ranks  DDP101/201
``skip_if_nonfinite``      the rank-local NaN skip                     DDP101
``EarlyStopping``          one rank stopping early                     DDP101
``gather_variable``        all_gather of different shapes              DDP203
``rank_zero_first``        a barrier that hangs when rank 0 fails      DDP201
``load_checkpoint``        checkpoints landing on GPU 0                DDP301
``local_device``           CUDA use before/without set_device          DDP302
``CUDAPrefetcher``         host-to-device copies stalling compute      DDP401/402
``lightning.DDPDoctorCallback``  uneven steps in Lightning jobs         DDP101
=========================  ==========================================  ===========

See docs/fixes.md for worked examples.
"""
from ddp_doctor.fixes.agree import EarlyStopping, agree, skip_if_nonfinite
from ddp_doctor.fixes.checkpoint import load_checkpoint, local_device, strip_prefix
from ddp_doctor.fixes.even import EvenBatches
from ddp_doctor.fixes.gather import gather_variable
from ddp_doctor.fixes.prefetch import CUDAPrefetcher, move_to
from ddp_doctor.fixes.rank_zero import RankZeroFailed, rank_zero_first

__all__ = [
    "EvenBatches", "agree", "skip_if_nonfinite", "EarlyStopping", "gather_variable", "rank_zero_first",
    "RankZeroFailed", "load_checkpoint", "local_device", "strip_prefix", "CUDAPrefetcher", "move_to",
]
