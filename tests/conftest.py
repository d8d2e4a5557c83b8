"""The order tests are handed to the pytest-xdist workers: the longest modules first.

`make test` runs two workers with `--dist loadscope --no-loadscope-reorder`: each module goes whole to the next
free worker, in collection order (xdist's own reorder, by test count, would send the modules of one long test
-- the generated-job samples -- last).  A long module handed out last would leave one worker running it alone
while the other has finished; started first, the short modules fill the tail instead.
So: the modules that launch real multi-rank jobs (``scenario``) before the others, and among them the few
longest (measured with `--durations`: a module fixture that runs tens of jobs) first of all.  The order of
the tests inside a module is kept.
"""
from __future__ import annotations

# module path -> rank among the longest (measured: `pytest --durations=0`, summed per module)
LONGEST_FIRST = ("tests/run/test_scenarios_run.py", "tests/launchers/test_watch.py", "tests/run/test_failing_jobs.py",
                 "tests/run/test_traps.py", "tests/attach/test_attach_jobs.py", "tests/parity/test_parity.py")


def pytest_collection_modifyitems(config, items):
    def weight(item) -> tuple[int, int]:
        path = item.nodeid.split("::", 1)[0]
        if path in LONGEST_FIRST:
            return 0, LONGEST_FIRST.index(path)
        return (1 if item.get_closest_marker("scenario") else 2), 0

    items.sort(key=weight)  # stable: a module's tests stay together and in order
