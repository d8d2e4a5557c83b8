"""attach's pieces without a job: stack classification, the one-line errors (py-spy missing, ptrace refused,
no torch), and the install path where only lint works."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import pytest

from ddp_doctor.attach.classify import classify
from ddp_doctor.attach.pyspy import parse_pyspy_json
from ddp_doctor.evidence import Site

SRC = Path(__file__).resolve().parents[2] / "src"
TORCH = "/venv/lib/python3.11/site-packages/torch"
STDLIB = sysconfig.get_paths()["stdlib"]  # this interpreter's standard library, as py-spy reports it


def F(path, line, fn):
    return Site(path, line, fn)


def test_object_collective_is_named_not_its_inner_all_gather():
    a = classify([F("/job/train.py", 40, "main"), F("/job/train.py", 12, "log"),
                  F(f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
                  F(f"{TORCH}/distributed/distributed_c10d.py", 3000, "all_gather_object"),
                  F(f"{TORCH}/distributed/distributed_c10d.py", 4280, "all_gather")])
    assert (a.kind, a.op, a.site.line) == ("object_collective", "all_gather_object", 12)


def test_run_and_attach_read_one_stack_as_the_same_collective():
    """A rank gloo aborted inside broadcast_object_list's inner broadcast, with no call on record: run names the
    call the user made (as the probe records it on the other ranks), as attach does, not the inner broadcast."""
    from ddp_doctor.diagnose.collectives import fatal_call
    from ddp_doctor.evidence import ExitStatus, RankState

    stack = (F("/job/train.py", 40, "main"), F(f"{TORCH}/distributed/c10d_logger.py", 83, "wrapper"),
             F(f"{TORCH}/distributed/distributed_c10d.py", 3100, "broadcast_object_list"),
             F(f"{TORCH}/distributed/distributed_c10d.py", 2700, "broadcast"),
             F(f"{TORCH}/distributed/distributed_c10d.py", 2720, "_check_single_tensor"))
    run = fatal_call(RankState(rank=0, stack=stack, exit=ExitStatus(-6, "SIGABRT")))
    assert run.op == classify(list(stack)).op == "broadcast_object_list"
    assert run.site.line == 40
    # a frame of torch's c10d that is no collective (a helper, group creation's store barrier) is not one
    helper = stack[:2] + (F(f"{TORCH}/distributed/distributed_c10d.py", 9, "_store_based_barrier"),)
    assert fatal_call(RankState(rank=0, stack=helper, exit=ExitStatus(-6, "SIGABRT"))) is None


def test_ddp_frames_with_qualified_names():
    init = classify([F("/job/t.py", 5, "<module>"),
                     F(f"{TORCH}/nn/parallel/distributed.py", 1064, "DistributedDataParallel.__init__"),
                     F(f"{TORCH}/distributed/utils.py", 286, "_verify_param_shape_across_processes")])
    assert (init.kind, init.op) == ("ddp", "ddp.init(broadcast_params)")
    fwd = classify([F("/job/t.py", 9, "train"), F(f"{TORCH}/nn/modules/module.py", 1778, "Module._wrapped_call_impl"),
                    F(f"{TORCH}/nn/parallel/distributed.py", 1886, "DistributedDataParallel.forward")])
    assert fwd.op == "ddp.forward(broadcast_buffers)" and fwd.site.line == 9
    bwd = classify([F("/job/t.py", 10, "train"), F(f"{TORCH}/_tensor.py", 623, "Tensor.backward"),
                    F(f"{TORCH}/autograd/graph.py", 979, "_engine_run_backward")])
    assert bwd.op == "ddp.backward(allreduce_grads)" and bwd.in_collective


def test_dataloader_wait_and_outside():
    data = classify([F("/job/t.py", 30, "main"),
                     F(f"{TORCH}/utils/data/dataloader.py", 700, "_BaseDataLoaderIter.__next__"),
                     F(f"{TORCH}/utils/data/dataloader.py", 1400, "_MultiProcessingDataLoaderIter._next_data"),
                     F(f"{STDLIB}/multiprocessing/connection.py", 900, "wait")])
    assert (data.kind, data.site.line) == ("data", 30)
    out = classify([F("/job/t.py", 30, "main"), F(f"{STDLIB}/threading.py", 327, "Condition.wait")])
    assert out.kind == "outside" and out.site.line == 30 and not out.in_collective


def test_pyspy_json_is_reversed_to_outermost_first():
    threads = parse_pyspy_json('[{"thread_id": 7, "os_thread_id": 99, "thread_name": "MainThread", "active": false,'
                               '"frames": [{"name": "inner", "filename": "/a.py", "line": 2},'
                               '{"name": "<module>", "filename": "/a.py", "line": 9}]}]')
    assert [f.line for f in threads[0].frames] == [9, 2] and threads[0].main


def _run(code: str, *args: str, env_extra: dict | None = None, user: str | None = None) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(SRC), NO_COLOR="1", **(env_extra or {}))
    cmd = [sys.executable, "-c", textwrap.dedent(code), *args]
    if user:
        cmd = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] + cmd
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)


NO_TORCH = """
    import sys
    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "torch" or name.startswith("torch."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
    sys.meta_path.insert(0, Block())
    from ddp_doctor.cli import main
    sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("cmd", [["run", "--nproc-per-node", "2", "train.py"], ["check"]])
def test_without_torch_runtime_commands_say_what_to_install(cmd):
    p = _run(NO_TORCH, *cmd)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "pip install 'ddp-doctor[run]'" in lines[0] and lines[0].startswith(f"ddp-doctor {cmd[0]}: needs PyTorch")


def test_without_torch_lint_and_attach_work(tmp_path):
    bad = tmp_path / "t.py"
    bad.write_text("import torch.distributed as dist\nrank = dist.get_rank()\nif rank == 0:\n    dist.barrier()\n")
    p = _run(NO_TORCH, "lint", str(bad))
    assert p.returncode == 1 and "DDP201" in p.stdout, p.stderr
    p = _run(NO_TORCH, "attach", str(os.getpid()))  # attach itself needs no torch: it reads stacks with py-spy
    assert p.returncode == 2 and "no training process found" in p.stderr and "Traceback" not in p.stderr


@pytest.fixture
def fake_rank():
    """A Python process that looks like rank 0 of a 1-rank job (RANK/WORLD_SIZE in its environment)."""
    p = subprocess.Popen([sys.executable, "-c", "import time\nprint('READY', flush=True)\nwhile True: time.sleep(0.1)"],
                         env=dict(os.environ, RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                                  MASTER_PORT="1"), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "READY\n"  # in its loop: the stacks attach reads are the steady ones
    yield p
    p.kill()
    p.wait()


ATTACH = "import sys\nfrom ddp_doctor.cli import main\nsys.exit(main(['attach', '--samples', '1'] + sys.argv[1:]))"


def test_attach_reads_a_fake_rank(fake_rank, tmp_path):
    out = tmp_path / "r.json"
    p = _run(ATTACH, str(fake_rank.pid), "--report", str(out))
    assert p.returncode in (0, 1), p.stderr
    import json

    rep = json.loads(out.read_text())
    assert rep["ranks"][0]["pid"] == fake_rank.pid and rep["ranks"][0]["stack"]


def test_pyspy_missing_is_one_line(fake_rank):
    hide = "import sys, os\nsys.executable = '/nonexistent/python'\nos.environ['PATH'] = '/nonexistent'\n"
    p = _run(hide + ATTACH, str(fake_rank.pid))
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "py-spy is not installed" in p.stderr and "pip install py-spy" in p.stderr


def test_ptrace_not_permitted_says_what_to_change(fake_rank):
    """As root: attach as user nobody to root's fake rank; otherwise attach to PID 1 (root's, never readable)."""
    if os.geteuid() == 0:
        p = _run(ATTACH, str(fake_rank.pid), user="65534")
    else:
        p = _run(ATTACH, "1")
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "not permitted (ptrace)" in p.stderr and "ptrace_scope" in p.stderr and "SYS_PTRACE" in p.stderr
