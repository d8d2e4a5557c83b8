"""``watch()`` in a thread a runner joins (Ray Train's ``ThreadRunner``): the rank's end must be on record
while that thread still lives, since Ray kills the worker actor within a health check of the thread's end.
The runner below has the shape of Ray's (``_run_target`` closing over ``self``, ``put(None)`` on its
exception queue when the function returned); Ray itself runs in tests/launchers/test_watch_ray.py."""
from __future__ import annotations

import queue
import threading

from ddp_doctor.probe import ending


class Runner:
    def __init__(self):
        self._exc_queue = queue.SimpleQueue()
        self._thread = None

    def run(self, target):
        def _run_target():
            try:
                target()
                self._exc_queue.put(None)
            except BaseException as e:  # noqa: BLE001
                self._exc_queue.put(e)

        self._thread = threading.Thread(target=_run_target)
        self._thread.start()


def test_finish_runs_inside_the_thread_before_it_returns():
    seen = []
    runner = Runner()

    def finish(code, exc=None, exit_exc=None):
        seen.append((code, threading.current_thread() is runner._thread, runner._exc_queue.qsize()))

    runner.run(lambda: ending.install(finish))
    runner._thread.join(10)
    assert seen and seen[0] == (0, True, 0)  # in the training thread, before Ray's queue heard of the end
    assert runner._exc_queue.get_nowait() is None  # Ray's own monitor still gets its None


def test_a_put_from_another_thread_is_not_the_end():
    seen = []
    runner = Runner()
    gate = threading.Event()

    def target():
        ending.install(lambda code, exc=None, exit_exc=None: seen.append((code, gate.is_set())))
        t = threading.Thread(target=lambda: runner._exc_queue.put(None))  # a nested thread's report
        t.start()
        t.join()
        gate.set()

    runner.run(target)
    runner._thread.join(10)
    assert seen[:1] == [(0, True)]  # not at the nested thread's put: at the function's own end
    assert runner._exc_queue.qsize() == 2  # both puts reached Ray's queue
