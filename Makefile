# Two commands: `make demo` and `make test`. Each creates the virtual environment if missing.
# PY picks the interpreter (python3.11 by default; `make test PY=python3.12` or PY=python3.13).
PY ?= python3.11
VENV ?= $(if $(filter python3.11,$(PY)),.venv,.venv-$(PY))
# pyenv shims hide versions that are not selected: fall back to pyenv's own folders.
PYBIN := $(or $(shell $(PY) -c 'import sys; print(sys.executable)' 2>/dev/null),\
	$(lastword $(wildcard $(HOME)/.pyenv/versions/*/bin/$(PY))),$(PY))
PYTHON := $(VENV)/bin/python
# torch is pinned: an unpinned torch would pull a multi-GB CUDA build.
TORCH := torch==2.13.0

.PHONY: demo test lint install

$(VENV)/.installed: pyproject.toml Makefile
	test -x $(PYTHON) || $(PYBIN) -m venv $(VENV)
	$(PYTHON) -m pip install -q $(TORCH)
	$(PYTHON) -m pip install -q -e '.[test]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(PYTHON) -m ember.demo

lint: install
	$(VENV)/bin/ruff check ember tests bench
	$(VENV)/bin/ruff format --check ember tests bench

test: install lint
	$(PYTHON) -m pytest tests
