"""`ddp_doctor.watch()` at the top of the file under every launcher, each a real 2-rank CPU job: a healthy run
reported clean, ending 0 with nothing of c10d's, no traceback and no C++ warning in any rank's output; a barrier
rank 0 alone calls named with its rank and line, and the job stopped; a raise on rank 1 named.  The report
says which launcher started the ranks and lies where the user launched from.  (Ray Train's, slower:
test_watch_ray.py; Lightning Fabric's and the HF Trainer's under `accelerate launch`: test_watch_shared.py.)"""
from __future__ import annotations

import sys

import pytest
from launch_helpers import HERE, accelerate_launch, ended, expect, free_port, rank_env, wait_report

pytestmark = pytest.mark.scenario
SCRIPTS = HERE / "scripts"
PLAIN = SCRIPTS / "watch_plain.py"
LIGHTNING = SCRIPTS / "lightning_watch.py"
ACCELERATE = SCRIPTS / "accelerate_watch.py"
HF = SCRIPTS / "hf_trainer_watch.py"
MODES = ["ok", "barrier", "raise"]


def _srun_style(procs, tmp_path, args: list[str], **env) -> dict:
    """One process per rank, RANK/WORLD_SIZE/LOCAL_RANK set by hand (as srun/mpirun wrappers do)."""
    report = tmp_path / "r.json"
    for r in (0, 1):
        procs.start([sys.executable, str(PLAIN), *args], rank_env(
            RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", DDP_DOCTOR_REPORT=str(report), **env), cwd=tmp_path)
    return wait_report(report, procs)


@pytest.mark.parametrize("mode", ["late", "barrier", "raise"])
def test_srun_style_watch(procs, tmp_path, mode):
    """"late": a healthy job whose rank 1 goes on alone past rank 0's end (and the side channel's store with
    it): reported clean, and rank 1's probe let go of the store first (no c10d stack trace in its output)."""
    rep = _srun_style(procs, tmp_path, [mode, "top"], MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    expect(rep, PLAIN, "ok" if mode == "late" else mode, "environment")
    ended(procs, "ok" if mode == "late" else mode)


@pytest.mark.parametrize("mode", MODES)
def test_mp_spawn_watch(procs, tmp_path, mode):
    """`torch.multiprocessing.spawn` from the script: the launching process is no rank (armed, never active);
    each child re-imports the file (the line runs again, as `__mp_main__`) and becomes a rank only in its
    `init_process_group(rank=..., world_size=2)`: no RANK or WORLD_SIZE anywhere.  Another service listens on
    MASTER_PORT + 1 (Ray's took it in CI): activated once the group exists, rank 0 hosts the side channel on
    a port the OS picks and announces it in torch's store.  A raise on rank 1: `mp.spawn` SIGTERMs rank 0 (and the
    watcher in it) as soon as rank 1 exits, so the failing rank waits for the watcher's report first."""
    import socket

    report, port = tmp_path / "r.json", free_port()
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port + 1))
        squatter.listen()
        procs.start([sys.executable, str(PLAIN), mode, "spawn"], rank_env(
            DDP_DOCTOR_REPORT=str(report), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), cwd=tmp_path)
        rep = wait_report(report, procs)
    expect(rep, PLAIN, mode, "torch.multiprocessing")
    assert rep["command"][-3:] == [str(PLAIN), mode, "spawn"], rep["command"]  # the user's, not the child's
    ended(procs, mode)


def test_srun_style_watch_after_init(procs, tmp_path):
    """watch() after init_process_group and DDP(): the group and the model are adopted (sequence numbers too)."""
    rep = _srun_style(procs, tmp_path, ["barrier", "after"], MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
    expect(rep, PLAIN, "barrier", "environment")
    assert all(r.get("ddp") for r in rep["ranks"]), rep["ranks"]


def test_mpirun_style_watch_without_master_port(procs, tmp_path):
    """No MASTER_ADDR/MASTER_PORT at all (init_method="tcp://..."): the store joins once the group exists."""
    rep = _srun_style(procs, tmp_path, ["raise", "top", f"tcp://127.0.0.1:{free_port()}"], OMPI_COMM_WORLD_SIZE="2")
    expect(rep, PLAIN, "raise", "mpirun")


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_lightning_watch(procs, tmp_path, strategy, mode):
    """`python train.py`: Lightning starts rank 1 itself (ddp: the started process is no rank until Trainer.fit
    makes it rank 0) or spawns both (ddp_spawn).  The barrier: a callback's at the end of an epoch, rank 0 only."""
    report = tmp_path / "r.json"
    # (Lightning picks a free MASTER_PORT itself when none is set; the watcher's is that + 1: give it a free pair)
    procs.start([sys.executable, str(LIGHTNING), mode, strategy],
                rank_env(DDP_DOCTOR_REPORT=str(report), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port())),
                cwd=tmp_path)
    expect(wait_report(report, procs), LIGHTNING, mode, f"lightning ({'subprocess' if strategy == 'ddp' else strategy})")
    ended(procs, mode)


@pytest.mark.parametrize("mode", MODES)
def test_accelerate_notebook_launcher_watch(procs, tmp_path, mode):
    report = tmp_path / "r.json"
    procs.start([sys.executable, str(ACCELERATE), mode, "notebook", str(free_port())],
                rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=tmp_path)
    expect(wait_report(report, procs), ACCELERATE, mode, "accelerate notebook_launcher")
    ended(procs, mode)


@pytest.mark.parametrize("mode", MODES)
def test_accelerate_launch_watch(procs, tmp_path, mode):
    report = tmp_path / "r.json"
    procs.start(accelerate_launch(ACCELERATE, mode), rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=tmp_path)
    expect(wait_report(report, procs), ACCELERATE, mode, "accelerate launch")
    ended(procs, mode)


@pytest.mark.parametrize("mode", ["ok", "eval_main_only", "raise"])
def test_hf_trainer_under_torchrun_watch(procs, tmp_path, mode):
    """The HF Trainer on a tiny randomly initialised model; the common hang: evaluating on the main process
    only (its gather waits for a rank that went on)."""
    report = tmp_path / "r.json"
    procs.start([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-endpoint",
                 f"127.0.0.1:{free_port()}", str(HF), mode, str(tmp_path / "out")],
                rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=tmp_path)
    rep = wait_report(report, procs)
    expect(rep, HF, "main_only" if mode == "eval_main_only" else mode, "torchrun (transformers Trainer)")
    ended(procs, mode)
