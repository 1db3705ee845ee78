# Two commands: `make demo` and `make test`. Each creates the virtual environment if missing.
# PY picks the interpreter (python3.11 by default; `make test PY=python3.12` or PY=python3.13),
# TORCH_VERSION the torch release (2.13.0 by default; `make test TORCH_VERSION=2.14.1`).
PY ?= python3.11
TORCH_VERSION ?= 2.13.0
VENV ?= .venv$(if $(filter-out python3.11,$(PY)),-$(PY))$(if $(filter-out 2.13.0,$(TORCH_VERSION)),-torch$(TORCH_VERSION))
# pyenv shims hide versions that are not selected: fall back to pyenv's own folders.
PYBIN := $(or $(shell $(PY) -c 'import sys; print(sys.executable)' 2>/dev/null),\
	$(lastword $(wildcard $(HOME)/.pyenv/versions/*/bin/$(PY))),$(PY))
PYTHON := $(VENV)/bin/python
# torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
TORCH := torch==$(TORCH_VERSION)
# triton is pinned to the release torch's CUDA wheels require (they install it themselves on
# 3.12/3.13; the CPU wheel of 3.11 does not, and the tests run Triton's interpreter).
TRITON := $(if $(filter 2.14.%,$(TORCH_VERSION)),triton~=3.8.0,triton==3.7.1)

.PHONY: demo test lint install

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PYTHON) || $(PYBIN) -m venv $(VENV)
	$(PYTHON) -m pip install -q $(TORCH) $(TRITON)
	$(PYTHON) -m pip install -q -e '.[test,triton]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PYTHON) -m ember.demo

lint: install
	$(VENV)/bin/ruff check ember tests bench
	$(VENV)/bin/ruff format --check ember tests bench

# The suite runs in one pytest worker per CPU (pytest-xdist; TEST_JOBS=0 runs it in this
# process): its time is mostly single-threaded Python and g++, so two workers on two cores
# take about 0.55x the time of one.
TEST_JOBS ?= auto

test: install lint
	$(PYTHON) -m pytest -n $(TEST_JOBS) --dist worksteal tests
