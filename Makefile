# fedmomentum: `make run` sets everything up and runs the main job; `make test` sets up and runs the suite.
PYTHON ?= python3.11
VENV   ?= .venv
BIN    := $(VENV)/bin
DATA   ?=
SHARED_DATA ?= $(abspath ../shared/data/cifar10-jpeg.tar.gz)
ARGS   ?=
# pytest-xdist workers of `make test` / `make test-fast` (tests sharing a costly fixture stay on one worker)
JOBS   ?= 2

.PHONY: setup run test test-fast theory bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[dev]"
	touch $@

# Main job: a small CIFAR-10 experiment (defaults: FedAvg, CNN, 20 clients, alpha=1, cyclic C=0.25, 10 rounds).
# Data: DATA if given, else $$FEDMOMENTUM_DATA, else SHARED_DATA when it exists, else torchvision's download
# (server/run/data_choice.py; its choice is the first line of the output).
run: setup
	$(BIN)/flower-simulation $$($(BIN)/python -m server.run.data_choice --data "$(DATA)" --shared "$(SHARED_DATA)" -- $(ARGS)) $(ARGS)

# Everything (what CI runs): ruff, then every test, JOBS at a time (tests/conftest.py groups shared fixtures).
test: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup $(ARGS)

# The edit-test loop (<= 3 min): unit, math, theory and validation tests plus one end-to-end simulation.
test-fast: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/python -m pytest -q -n $(JOBS) --dist loadgroup -m "not e2e or smoke" $(ARGS)

theory: setup
	$(BIN)/flower-theory all --out outputs/theory

clean:
	rm -rf $(VENV) outputs multirun .pytest_cache .ruff_cache
