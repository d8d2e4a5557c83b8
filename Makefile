# The two commands of the README: `make demo` (set up, then run the main job) and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch==2.13.0 first and pinned: a bare `torch` would pull multi-GB CUDA wheels.
TORCH ?= torch==2.13.0

.PHONY: demo test test-fast setup browser

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[test]' "$(TORCH)"
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(VENV)/bin/ddp-doctor demo

# Headless chromium for the HTML report test (skipped, visibly, where it cannot be installed).
browser:
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium >/dev/null; } || echo "chromium not installed: the HTML browser test will be skipped"

test: setup browser
	$(PY) -m pytest

# The fast tier (< 2 minutes): everything that launches no multi-rank job (`scenario` marks those):
# unit tests, lint fixtures, renderers fed with reports and evidence captured from real runs, golden texts.
test-fast: setup
	$(PY) -m pytest -m "not scenario" -q
