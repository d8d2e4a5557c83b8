# The two commands of the README: `make demo` (set up, then run the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch==2.13.0 first and pinned: a bare `torch` would pull multi-GB CUDA wheels.
TORCH ?= torch==2.13.0

.PHONY: demo test test-fast setup browser compile

# One resolve for everything (the pin next to the extras keeps torch the CPU build).
$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q -e '.[test]' "$(TORCH)"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/ddp-doctor demo

# Headless chromium for the HTML report tests; they fail (not skip) without it.
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || { echo "chromium could not be installed (needs root or: apt-get install chromium): the HTML report tests will fail"; exit 1; }

# Two pytest workers (pytest-xdist), a test module's tests on one worker so its shared fixture (one run of
# a job, checked by several tests) runs once; the `timing` tests (perf measurements of real jobs: a loaded
# machine changes what they measure) run afterwards, alone.  The modules go to the workers in the order
# tests/conftest.py gives them, longest first (xdist would reorder them by test count, sending the modules of
# one long test -- the generated-job samples -- last, to run alone at the end).
PARALLEL := -n 2 --dist loadscope --no-loadscope-reorder

# Each test launches hundreds of Python processes that import ddp-doctor: compile its modules once here
# (with PYTHONDONTWRITEBYTECODE set no process would cache them, and each recompiled about 90 modules).
compile: setup
	$(PY) -m compileall -q src

test: setup browser compile
	$(PY) -m pytest $(PARALLEL) -m "not timing"
	$(PY) -m pytest -m timing

# The fast tier (< 1 minute): everything that launches no real rank process (`scenario` marks those):
# unit tests, lint fixtures, renderers fed with reports and evidence captured from real runs, golden texts.
test-fast: setup browser compile
	$(PY) -m pytest $(PARALLEL) -m "not scenario" -q
