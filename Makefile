# `make demo` and `make test` work on a fresh machine: they create .venv and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A CPU build of torch. A looser requirement would pull a multi-GB CUDA build here; on a GPU machine
# override it, e.g. `make test TORCH_SPEC=torch`.
TORCH_SPEC ?= torch==2.13.0
export OMP_NUM_THREADS ?= 1

.PHONY: demo test lint typecheck pytest examples-test bench cuda-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

demo: $(VENV)/.installed
	$(BIN)/paratrain demo

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks examples
	$(BIN)/ruff format --check src tests benchmarks examples

typecheck: $(VENV)/.installed
	$(BIN)/mypy --strict src/

pytest: $(VENV)/.installed
	$(BIN)/pytest -q -m "not dist and not examples"
	$(BIN)/pytest -q -m "dist and not examples"

test: lint typecheck pytest

# Every shipped example (examples/) end to end at tiny size on 2 CPU ranks, and the notebook.
examples-test: $(VENV)/.installed
	$(BIN)/pytest -q -m examples

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/checkpoint_io.py

# The CUDA paths (run on a GPU machine, with a CUDA build of torch: TORCH_SPEC=torch).
cuda-check: $(VENV)/.installed
	$(BIN)/python benchmarks/cuda_paths.py

clean:
	rm -rf $(VENV) runs .pytest_cache .mypy_cache .ruff_cache
