# The two commands a new machine needs: `make demo` and `make test`.
PYTHON ?= python3.11
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install demo test lint bench profile clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[test,bench]'
	touch $@

install: $(BIN)/.installed

demo: install
	$(BIN)/mydata-batch demo

lint: install
	$(BIN)/ruff check planning batch tests
	$(BIN)/mypy planning batch

# Two pytest-xdist workers, one per core: the real-time subprocess tests run one group at a
# time on each (tests/conftest.py), the rest fill in. A third worker beside them made the
# multi-process cluster tests fall behind their scaled clocks on a slow machine.
test: lint
	$(BIN)/python -m pytest -q -n 2 --dist loadgroup

bench: install
	$(BIN)/python -m pytest -q -s tests/bench

# Where the CPU goes on a saturated full-path run (cProfile, or PROFILER=py-spy sampled;
# PROFILE_BACKEND=sqlite|postgresql; PROFILE_BASELINE=a3 profiles (a3) instead, to set beside it)
profile: install
	PROFILER=$${PROFILER:-cprofile} PROFILE_BACKEND=$${PROFILE_BACKEND:-sqlite} $(BIN)/python -m tests.bench.profile_dispatch

clean:
	rm -rf $(VENV) mydata.db demo-out .pytest_cache .mypy_cache .ruff_cache
