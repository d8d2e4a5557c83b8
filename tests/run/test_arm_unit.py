"""`ddp_doctor.watch()` in a process that is not a rank (yet): armed at no cost, never active without a group of
several ranks; the import hook and Ray Train's training-function wrapper.  (The real launches: tests/launchers.)"""
from __future__ import annotations

import inspect
import json
import os
import pickle
import subprocess
import sys
import types
from pathlib import Path

from ddp_doctor.probe import arm

SRC = Path(__file__).resolve().parents[2] / "src"

NOT_A_RANK = r"""
import json, socket, sys, threading
import ddp_doctor
before = threading.active_count()
watched = ddp_doctor.watch()
out = {"watched": watched, "torch_imported": "torch" in sys.modules}
import torch.distributed as dist
out["armed"] = bool(getattr(dist.init_process_group, "__ddp_doctor_armed__", False))
with socket.socket() as s:
    s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
from ddp_doctor.probe import active
out["active"] = active() is not None
out["still_armed"] = bool(getattr(dist.init_process_group, "__ddp_doctor_armed__", False))
out["threads"] = threading.active_count() - before
out["twice"] = ddp_doctor.watch()
dist.destroy_process_group()
print(json.dumps(out))
"""


def test_watch_in_a_process_that_is_no_rank_arms_and_costs_nothing():
    """No launcher environment, a group of one rank: nothing installed, no thread, torch not imported by watch()."""
    env = {k: v for k, v in os.environ.items() if k not in ("WORLD_SIZE", "RANK", "DDP_DOCTOR_STORE")}
    p = subprocess.run([sys.executable, "-c", NOT_A_RANK], env=dict(env, PYTHONPATH=str(SRC)),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out == {"watched": False, "torch_imported": False, "armed": True, "active": False, "still_armed": True,
                   "threads": 0, "twice": False}, out
    assert "ddp-doctor" not in p.stderr and "Traceback" not in p.stderr, p.stderr  # (gloo may warn of the host name)


def test_after_import_runs_the_hook_once_the_module_is_executed(tmp_path, monkeypatch):
    (tmp_path / "ddpd_arm_probe_mod.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    seen = []
    arm.after_import("ddpd_arm_probe_mod", lambda m: seen.append(m.VALUE))
    assert seen == []
    import ddpd_arm_probe_mod  # noqa: F401

    assert seen == [1]
    assert not any(isinstance(f, arm._AfterImport) for f in sys.meta_path)  # it left the finders
    arm.after_import("ddpd_arm_probe_mod", lambda m: seen.append(2))  # already imported: at once
    assert seen == [1, 2]
    sys.modules.pop("ddpd_arm_probe_mod", None)


def train_func(config):
    return config["x"] + 1


def test_ray_trainers_training_function_calls_watch_first(monkeypatch):
    """Ray counts the function's parameters (the signature is the user's), pickles it (by reference to the
    wrapper class) and calls it in the worker: watch() first."""
    calls = []
    monkeypatch.setattr("ddp_doctor.watch", lambda: calls.append("watch") or True)

    class DataParallelTrainer:
        def __init__(self, train_loop_per_worker, **kw):
            self.train_loop_per_worker = train_loop_per_worker

    module = types.SimpleNamespace(DataParallelTrainer=DataParallelTrainer)
    arm._wrap_ray_trainer(module, "train_loop_per_worker")
    arm._wrap_ray_trainer(module, "train_loop_per_worker")  # once only
    fn = DataParallelTrainer(train_func).train_loop_per_worker
    assert isinstance(fn, arm.Watched) and not isinstance(fn.fn, arm.Watched)
    assert list(inspect.signature(fn).parameters) == ["config"] and fn.__name__ == "train_func"
    again = pickle.loads(pickle.dumps(fn))
    assert again({"x": 1}) == 2 and calls == ["watch"]
