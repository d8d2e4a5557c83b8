"""``ddp_doctor.watch()`` called before the process knows it will be a rank: armed, activated when its group forms.

The top of the training file is where people put such a line, and there several launchers have not yet
made the process a rank: Lightning's ``python train.py`` (the started process becomes rank 0 only inside
``Trainer.fit``; it starts the other ranks itself), ``mp.spawn`` / Lightning's ``ddp_spawn`` (each child
re-imports the file as ``__mp_main__``, then runs the function that calls ``init_process_group``),
accelerate's ``notebook_launcher`` (forked children inherit the armed parent), a Ray Train driver (the
workers run a pickled training function, never the top of the file).

Arming costs nothing in a process that never becomes a rank: ``init_process_group`` is wrapped (once
``torch.distributed`` is imported, by an import hook if it is not yet), and Ray Train's trainers wrap the
training function they are given so that each worker calls ``watch()`` first.  When the default group
forms with more than one rank, the wrapper takes itself out and calls ``activate`` (the probe, adopting the
group, rank 0 hosting the watcher: the same as ``watch()`` after ``init_process_group``).
"""
from __future__ import annotations

import functools
import sys
from typing import Any, Callable

C10D = "torch.distributed.distributed_c10d"
# Ray Train's trainers (v2, then v1) and the attribute each keeps the training function in
RAY_TRAINERS = (("ray.train.v2.api.data_parallel_trainer", "train_loop_per_worker"),
                ("ray.train.data_parallel_trainer", "_train_loop_per_worker"))

_armed = False


def arm(activate: Callable[[], Any]) -> bool:
    """Call ``activate()`` once a default process group of several ranks forms in this process (idempotent).
    False when torch is not installed (nothing could ever form a group here)."""
    global _armed
    if _armed:
        return True
    import importlib.util

    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return False
    _armed = True
    after_import(C10D, lambda c10d: _wrap_init(c10d, activate))
    for module, attr in RAY_TRAINERS:
        after_import(module, lambda m, attr=attr: _wrap_ray_trainer(m, attr))
    return True


def _wrap_init(c10d, activate: Callable[[], Any]) -> None:
    """Wrap ``init_process_group`` until a group of several ranks forms: then restore it and activate."""
    orig = c10d.init_process_group
    if getattr(orig, "__ddp_doctor_armed__", False):
        return

    @functools.wraps(orig)
    def init_process_group(*args, **kwargs):
        out = orig(*args, **kwargs)
        try:
            several = c10d.get_world_size() > 1
        except Exception:
            several = False
        if several:
            _restore(c10d, init_process_group, orig)
            activate()
        return out

    init_process_group.__ddp_doctor_armed__ = True
    c10d.init_process_group = init_process_group
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "init_process_group", None) is orig:
        dist.init_process_group = init_process_group


def _restore(c10d, wrapper, orig) -> None:
    """The armed wrapper out of the way: the probe's own (``groups.patch_init``) wraps the original."""
    if c10d.init_process_group is wrapper:
        c10d.init_process_group = orig
    dist = sys.modules.get("torch.distributed")
    if dist is not None and getattr(dist, "init_process_group", None) is wrapper:
        dist.init_process_group = orig


class Watched:
    """A Ray Train training function that calls ``ddp_doctor.watch()`` first, in the worker's training
    thread (the group exists by then).  Pickled by reference to this class, the function by value; its
    signature is the function's (``__wrapped__``: Ray counts its parameters to decide on the config)."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.fn = fn
        functools.update_wrapper(self, fn)

    def __call__(self, *args, **kwargs):
        from ddp_doctor import watch

        watch()
        return self.fn(*args, **kwargs)


def _wrap_ray_trainer(module, attr: str) -> None:
    cls = getattr(module, "DataParallelTrainer", None)
    init = getattr(cls, "__init__", None)
    if init is None or getattr(init, "__ddp_doctor_armed__", False):
        return

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):
        init(self, *args, **kwargs)
        fn = getattr(self, attr, None)
        if callable(fn) and not isinstance(fn, Watched):
            setattr(self, attr, Watched(fn))

    __init__.__ddp_doctor_armed__ = True
    cls.__init__ = __init__


class _AfterImport:
    """A meta-path finder that runs ``fn(module)`` right after ``name`` is executed, then leaves ``sys.meta_path``
    (``torch.distributed``'s ``from .distributed_c10d import *`` then takes the wrapped function)."""

    def __init__(self, name: str, fn: Callable[[Any], None]) -> None:
        self.name, self.fn = name, fn

    def find_spec(self, fullname, path=None, target=None):
        if fullname != self.name:
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if exec_module is None:
            return spec
        fn = self.fn

        def run_then_hook(module):
            exec_module(module)
            try:
                fn(module)
            except Exception:
                pass

        loader.exec_module = run_then_hook  # (this loader instance belongs to this module's spec alone)
        return spec


def after_import(name: str, fn: Callable[[Any], None]) -> None:
    """``fn(module)`` now if ``name`` is imported, else right after it is."""
    module = sys.modules.get(name)
    if module is not None:
        try:
            fn(module)
        except Exception:
            pass
        return
    sys.meta_path.insert(0, _AfterImport(name, fn))
