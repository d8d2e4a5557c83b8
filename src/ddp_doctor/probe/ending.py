"""How a rank's program ended, under ``ddp_doctor.watch()``: there is no runpy around the program (as
``python -m ddp_doctor.probe`` has), so the probe learns it where the process, or the thread that called
``watch()``, ends.  ``finish(exit_code, exc, exit_exc)`` is :meth:`ddp_doctor.probe.Probe.finish` (once).

- an exception nobody caught, in the main thread: ``sys.excepthook`` (chained);
- ``watch()`` called from another thread (Ray Train runs the training function in a thread of its worker
  actor, which lives on): that thread's end; Ray catches the function's exception itself, so its
  ``construct_user_exception_with_traceback`` is wrapped to see it first, and its runner's queue to see
  the function return *inside* the thread: Ray's controller kills the worker actors within one health
  check (2 s) of the thread's end, which can be before a watcher outside the thread wrote the report;
- a multiprocessing child (``torch.multiprocessing.spawn``: Lightning's ddp_spawn, accelerate's
  notebook_launcher): a multiprocessing finaliser.  Such children end by ``os._exit`` (no atexit); the
  finaliser runs while the child's SystemExit propagates, and torch's ``_wrap`` turns the function's
  exception into ``sys.exit(1)`` inside its ``except``, so the exception is that SystemExit's context;
- otherwise ``atexit``: the program returned or called ``sys.exit`` (exit code 0 recorded: atexit does
  not see the code).
"""
from __future__ import annotations

import sys
import threading
from typing import Callable

Finish = Callable[..., None]
RAY_RUNNER = "ray.train.v2._internal.execution.worker_group.thread_runner"


def install(finish: Finish) -> None:
    """Call ``finish`` when this rank's program ends (see the module docstring for how that is seen)."""
    _chain_excepthook(finish)
    caller = threading.current_thread()
    if caller is not threading.main_thread():
        _wrap_ray(finish, caller)
        _finish_in_ray_thread(finish, caller)
        threading.Thread(target=_after_thread, args=(caller, finish), name="ddp-doctor-end", daemon=True).start()
        return
    import multiprocessing

    if multiprocessing.parent_process() is not None:
        from multiprocessing.util import Finalize

        Finalize(None, _at_child_exit, args=(finish,), exitpriority=100)
        return
    import atexit

    atexit.register(finish, 0)


def _chain_excepthook(finish: Finish) -> None:
    previous = sys.excepthook

    def excepthook(tp, value, tb):
        if not isinstance(value, (SystemExit, KeyboardInterrupt)):
            finish(1, value)
        previous(tp, value, tb)

    sys.excepthook = excepthook


def _after_thread(thread: threading.Thread, finish: Finish) -> None:
    thread.join()
    finish(0)


def _at_child_exit(finish: Finish) -> None:
    """In a multiprocessing child's exit: the SystemExit propagating (with torch's caught exception as its
    context), another exception, or none (the function returned)."""
    exc = sys.exc_info()[1]
    if isinstance(exc, SystemExit):
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        cause = exc.__context__ if code else None
        finish(code, cause if isinstance(cause, BaseException) else None, exit_exc=exc)
    elif isinstance(exc, BaseException) and not isinstance(exc, KeyboardInterrupt):
        finish(1, exc)
    else:
        finish(0)


def _wrap_ray(finish: Finish, thread: threading.Thread) -> None:
    """Ray Train's thread runner hands the training function's exception to this function of its module
    (looked up when it is raised): see it first, in the watched thread."""
    runner = sys.modules.get(RAY_RUNNER)
    fn = getattr(runner, "construct_user_exception_with_traceback", None)
    if fn is None or hasattr(fn, "__ddp_doctor_wrapped__"):
        return

    def construct_user_exception_with_traceback(e, *args, **kwargs):
        if threading.current_thread() is thread:
            finish(1, e)
        return fn(e, *args, **kwargs)

    construct_user_exception_with_traceback.__ddp_doctor_wrapped__ = fn
    runner.construct_user_exception_with_traceback = construct_user_exception_with_traceback


class _FinishFirst:
    """Ray's runner's exception queue, seen by the probe: the training thread's ``put(None)`` (its function
    returned) first finishes the rank, while the thread is still alive, so Ray waits for the report."""

    def __init__(self, queue, finish: Finish, thread: threading.Thread):
        self._queue, self._finish, self._thread = queue, finish, thread

    def put(self, item, *args, **kwargs):
        if item is None and threading.current_thread() is self._thread:
            self._finish(0)
        return self._queue.put(item, *args, **kwargs)

    def __getattr__(self, name):
        return getattr(self._queue, name)


def _finish_in_ray_thread(finish: Finish, thread: threading.Thread) -> None:
    """Find Ray Train's ``ThreadRunner`` running this thread (the ``self`` of its ``_run_target`` frame) and
    see its function's return through the runner's queue (see :class:`_FinishFirst`)."""
    f = sys._getframe(1)
    while f is not None:
        runner = f.f_locals.get("self") if f.f_code.co_name == "_run_target" else None
        queue = getattr(runner, "_exc_queue", None)
        if queue is not None and callable(getattr(queue, "put", None)):
            if not isinstance(queue, _FinishFirst):
                runner._exc_queue = _FinishFirst(queue, finish, thread)
            return
        f = f.f_back
