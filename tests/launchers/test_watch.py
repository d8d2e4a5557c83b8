"""`ddp_doctor.watch()` at the top of the file under every launcher, each a real 2-rank CPU job: a healthy run
reported clean, ending 0 with nothing of c10d's, no traceback and no C++ warning in any rank's output; a barrier
rank 0 alone calls named with its rank and line, and the job stopped; a raise on rank 1 named.  The report
says which launcher started the ranks and lies where the user launched from.  Each launcher's cases start at
once from one module fixture and each test reads one of them (their waits overlap: CI time).  (Ray Train's,
slower: test_watch_ray.py; Lightning Fabric's and the HF Trainer's under `accelerate launch`:
test_watch_shared.py.)"""
from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest
from launch_helpers import HERE, accelerate_launch, ended, expect, free_port, rank_env, running

pytestmark = pytest.mark.scenario
SCRIPTS = HERE / "scripts"
PLAIN = SCRIPTS / "watch_plain.py"
LIGHTNING = SCRIPTS / "lightning_watch.py"
ACCELERATE = SCRIPTS / "accelerate_watch.py"
HF = SCRIPTS / "hf_trainer_watch.py"
MODES = ["ok", "barrier", "raise"]


def _srun_style(procs, report: Path, args: list[str], **env) -> None:
    """One process per rank, RANK/WORLD_SIZE/LOCAL_RANK set by hand (as srun/mpirun wrappers do)."""
    for r in (0, 1):
        procs.start([sys.executable, str(PLAIN), *args], rank_env(
            RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2", DDP_DOCTOR_REPORT=str(report), **env), cwd=report.parent)


def _addr() -> dict:
    return {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}


@pytest.fixture(scope="module")
def srun_style(tmp_path_factory):
    """"late": a healthy job whose rank 1 goes on alone past rank 0's end (and the side channel's store with
    it); "after": watch() after init_process_group and DDP(); "mpirun": no MASTER_ADDR/MASTER_PORT at all
    (init_method="tcp://..."): the store joins once the group exists."""
    def start(procs, mode, report):
        if mode == "after":
            _srun_style(procs, report, ["barrier", "after"], **_addr())
        elif mode == "mpirun":
            _srun_style(procs, report, ["raise", "top", f"tcp://127.0.0.1:{free_port()}"], OMPI_COMM_WORLD_SIZE="2")
        else:
            _srun_style(procs, report, [mode, "top"], **_addr())

    with running(tmp_path_factory.mktemp("srun"), ["late", "barrier", "raise", "after", "mpirun"], start) as cases:
        yield cases


@pytest.mark.parametrize("mode", ["late", "barrier", "raise"])
def test_srun_style_watch(srun_style, mode):
    """rank 1's probe let go of the store first in "late" (no c10d stack trace in its output)."""
    expect(srun_style[mode].report, PLAIN, "ok" if mode == "late" else mode, "environment")
    ended(srun_style[mode].procs, "ok" if mode == "late" else mode)


def test_srun_style_watch_after_init(srun_style):
    """The group and the model are adopted (sequence numbers too)."""
    rep = srun_style["after"].report
    expect(rep, PLAIN, "barrier", "environment")
    assert all(r.get("ddp") for r in rep["ranks"]), rep["ranks"]


def test_mpirun_style_watch_without_master_port(srun_style):
    expect(srun_style["mpirun"].report, PLAIN, "raise", "mpirun")


@pytest.fixture(scope="module")
def mp_spawn(tmp_path_factory):
    """`torch.multiprocessing.spawn` from the script: the launching process is no rank (armed, never active);
    each child re-imports the file (the line runs again, as `__mp_main__`) and becomes a rank only in its
    `init_process_group(rank=..., world_size=2)`: no RANK or WORLD_SIZE anywhere.  Another service listens on
    MASTER_PORT + 1 (Ray's took it in CI): activated once the group exists, rank 0 hosts the side channel on
    a port the OS picks and announces it in torch's store.  A raise on rank 1: `mp.spawn` SIGTERMs rank 0 (and the
    watcher in it) as soon as rank 1 exits, so the failing rank waits for the watcher's report first."""
    squatters = []

    def start(procs, mode, report):
        port = free_port()
        squatter = socket.socket()
        squatter.bind(("127.0.0.1", port + 1))
        squatter.listen()
        squatters.append(squatter)
        procs.start([sys.executable, str(PLAIN), mode, "spawn"], rank_env(
            DDP_DOCTOR_REPORT=str(report), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port)), cwd=report.parent)

    try:
        with running(tmp_path_factory.mktemp("spawn"), MODES, start) as cases:
            yield cases
    finally:
        for s in squatters:
            s.close()


@pytest.mark.parametrize("mode", MODES)
def test_mp_spawn_watch(mp_spawn, mode):
    rep = mp_spawn[mode].report
    expect(rep, PLAIN, mode, "torch.multiprocessing")
    assert rep["command"][-3:] == [str(PLAIN), mode, "spawn"], rep["command"]  # the user's, not the child's
    ended(mp_spawn[mode].procs, mode)


def _lightning(tmp_path_factory, strategy: str):
    # (Lightning picks a free MASTER_PORT itself when none is set; the watcher's is that + 1: give it a free pair)
    def start(procs, mode, report):
        procs.start([sys.executable, str(LIGHTNING), mode, strategy],
                    rank_env(DDP_DOCTOR_REPORT=str(report), **_addr()),
                    cwd=report.parent)

    return running(tmp_path_factory.mktemp(strategy), MODES, start)


@pytest.fixture(scope="module")
def lightning_ddp(tmp_path_factory):
    """`python train.py`: Lightning starts rank 1 itself; the started process is no rank until Trainer.fit makes
    it rank 0.  The barrier: a callback's at the end of an epoch, rank 0 only."""
    with _lightning(tmp_path_factory, "ddp") as cases:
        yield cases


@pytest.fixture(scope="module")
def lightning_ddp_spawn(tmp_path_factory):
    """Lightning spawns both ranks (ddp_spawn)."""
    with _lightning(tmp_path_factory, "ddp_spawn") as cases:
        yield cases


@pytest.mark.parametrize("mode", MODES)
def test_lightning_watch_ddp(lightning_ddp, mode):
    expect(lightning_ddp[mode].report, LIGHTNING, mode, "lightning (subprocess)")
    ended(lightning_ddp[mode].procs, mode)


@pytest.mark.parametrize("mode", MODES)
def test_lightning_watch_ddp_spawn(lightning_ddp_spawn, mode):
    expect(lightning_ddp_spawn[mode].report, LIGHTNING, mode, "lightning (ddp_spawn)")
    ended(lightning_ddp_spawn[mode].procs, mode)


@pytest.fixture(scope="module")
def notebook(tmp_path_factory):
    def start(procs, mode, report):
        procs.start([sys.executable, str(ACCELERATE), mode, "notebook", str(free_port())],
                    rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=report.parent)

    with running(tmp_path_factory.mktemp("notebook"), MODES, start) as cases:
        yield cases


@pytest.mark.parametrize("mode", MODES)
def test_accelerate_notebook_launcher_watch(notebook, mode):
    expect(notebook[mode].report, ACCELERATE, mode, "accelerate notebook_launcher")
    ended(notebook[mode].procs, mode)


@pytest.fixture(scope="module")
def accelerate(tmp_path_factory):
    def start(procs, mode, report):
        procs.start(accelerate_launch(ACCELERATE, mode), rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=report.parent)

    with running(tmp_path_factory.mktemp("accelerate"), MODES, start) as cases:
        yield cases


@pytest.mark.parametrize("mode", MODES)
def test_accelerate_launch_watch(accelerate, mode):
    expect(accelerate[mode].report, ACCELERATE, mode, "accelerate launch")
    ended(accelerate[mode].procs, mode)


@pytest.fixture(scope="module")
def hf_torchrun(tmp_path_factory):
    """The HF Trainer on a tiny randomly initialised model; the common hang: evaluating on the main process
    only (its gather waits for a rank that went on)."""
    def start(procs, mode, report):
        procs.start([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--rdzv-endpoint",
                     f"127.0.0.1:{free_port()}", str(HF), mode, str(report.parent / "out")],
                    rank_env(DDP_DOCTOR_REPORT=str(report)), cwd=report.parent)

    with running(tmp_path_factory.mktemp("hf"), ["ok", "eval_main_only", "raise"], start) as cases:
        yield cases


@pytest.mark.parametrize("mode", ["ok", "eval_main_only", "raise"])
def test_hf_trainer_under_torchrun_watch(hf_torchrun, mode):
    expect(hf_torchrun[mode].report, HF, "main_only" if mode == "eval_main_only" else mode,
           "torchrun (transformers Trainer)")
    ended(hf_torchrun[mode].procs, mode)
