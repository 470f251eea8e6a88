# `make run` and `make test` work on a fresh clone with nothing but Python 3 and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run cli check test floors lint gpu-test clean

# The pinned requirements, then the package itself, editable: `.venv/bin/anatomy` and
# `.venv/bin/python examples/plain_loop.py` run this clone's code from anywhere.
$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -r requirements-dev.txt
	$(BIN)/python -m pip install -q -e .
	touch $(STAMP)

# The dashboard, on http://localhost:8501 (this machine only; `anatomy dashboard --help`).
run: $(STAMP)
	$(BIN)/python -m anatomy dashboard

# One run without the dashboard: the same engine, printing each phase's memory.
cli: $(STAMP)
	$(BIN)/python -m anatomy run

# Tests in parallel (pytest-xdist; worksteal: a worker that is done takes another's queue).
XDIST := --dist worksteal
# `make test` runs half as many workers again as there are cores: an e2e test mostly waits on the
# processes it started (a run's worker, its sampler, a browser), which use less than its core,
# and a third worker on two cores fills what they leave (the fault tests: 220 s with 2 workers,
# 130 s with 3, the same CPU seconds; 4: no better). The unit tier runs in-process, every worker
# busy: one a core (a third only adds its collection and switching: +28 % CPU).
TEST_WORKERS = $(shell $(PYTHON) -c "import os; print(max(2, (os.cpu_count() or 1) * 3 // 2))")

# Python writes no bytecode where PYTHONDONTWRITEBYTECODE is set (this machine, CI): each of the
# suite's ~100 processes compiled the package's modules again (0.13 CPU s for the engine's).
# compileall writes it (up-to-date files are skipped; __pycache__ is ignored by git).
BYTECODE = $(BIN)/python -m compileall -q anatomy tests bench tools examples > /dev/null

# The unit tier (tests/unit/: in-process, no process started), for the edit loop.
check: $(STAMP)
	$(BYTECODE)
	$(BIN)/python -m pytest -q -n auto $(XDIST) tests/unit

# Everything: the unit tier and tests/e2e/ (the worker, the CLI, Streamlit, Chromium, pip install,
# the prediction's proofs on whole traces).
test: $(STAMP)
	$(BYTECODE)
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) $(XDIST)

# The unit tier again on the oldest versions pyproject.toml allows of the libraries whose own
# modules the prediction mirrors (tools/floors.py reads them there): pip keeps what a user's
# environment holds where it satisfies a floor, so a floor must be a version that works. torch
# stays the CPU build on disk (its floor, 2.10, was run by hand: docs/RELIABILITY.md).
FLOORED := transformers peft accelerate datasets
FLOORS_VENV := .venv-floors
floors: $(STAMP)
	test -x $(FLOORS_VENV)/bin/python || $(PYTHON) -m venv $(FLOORS_VENV)
	$(FLOORS_VENV)/bin/python -m pip install -q -r requirements-dev.txt
	$(FLOORS_VENV)/bin/python -m pip install -q $$($(BIN)/python tools/floors.py $(FLOORED))
	$(FLOORS_VENV)/bin/python -m pip install -q --no-deps -e .
	$(FLOORS_VENV)/bin/python -m pytest -q -n auto $(XDIST) -p no:cacheprovider tests/unit

# ruff, and the layers and import rules of pyproject.toml's [tool.importlinter] (docs/ARCHITECTURE.md).
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/lint-imports --no-cache

clean:
	rm -rf $(VENV) $(FLOORS_VENV) .pytest_cache
