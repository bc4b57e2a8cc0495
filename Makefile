# `make demo` and `make test` work on a fresh machine: they create .venv and install what they need.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The torch the checks run on. tools/install_torch.py installs it from PyTorch's CPU wheel index on
# a machine without an NVIDIA GPU (PyPI's Linux wheels carry CUDA, several GB) and from the default
# index on one with a GPU; `make test TORCH_INSTALL_FLAGS=--no-cpu-index` asks only the default.
TORCH_SPEC ?= torch==2.13.0
TORCH_INSTALL_FLAGS ?=
INSTALL_TORCH = $(BIN)/python tools/install_torch.py $(BIN)/python "$(TORCH_SPEC)" $(TORCH_INSTALL_FLAGS)
export OMP_NUM_THREADS ?= 1

.PHONY: demo dist test lint typecheck docs pytest release-test serve-deps examples-test e2e-test scale-test layouts-test kill-trials mutants-test image-test bench cuda-check clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip

# Everything the checks need (ruff, mypy, pytest, mkdocs, the extras the tests exercise). The dev
# set includes the demo extra, so it marks the demo's install done too.
$(VENV)/.installed: $(BIN)/python pyproject.toml
	$(INSTALL_TORCH)
	$(BIN)/pip install -q -e ".[dev]"
	touch $@ $(VENV)/.installed-demo

# Only what the demo needs: the runtime and the demo extra (a .venv made by `make test` has it).
$(VENV)/.installed-demo: $(BIN)/python pyproject.toml
	$(INSTALL_TORCH)
	$(BIN)/pip install -q -e ".[demo]"
	touch $@

demo: $(VENV)/.installed-demo
	$(BIN)/paratrain demo

# The sdist and the wheel, in dist/ (`pip install dist/paratrain-*.whl` installs the wheel).
dist: $(BIN)/python
	$(BIN)/pip install -q build
	$(BIN)/python -m build --outdir dist .

lint: $(VENV)/.installed
	$(BIN)/ruff check src tests benchmarks examples tools docs/hooks
	$(BIN)/ruff format --check src tests benchmarks examples tools docs/hooks
	$(BIN)/hadolint docker/Dockerfile

typecheck: $(VENV)/.installed
	$(BIN)/mypy --strict src/

# The documentation site (mkdocs.yml, docs/): a broken link or reference fails the build.
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet --site-dir site

SLOW := examples or scale or e2e or kill_trials or layouts or release or mutants
# Test processes side by side (pytest-xdist): the unit tests, the examples and the scale proofs
# share 2 cores well. The multi-rank suite runs one test at a time: two of them at once (529 s
# instead of 753 s) made ranks that exit on purpose abort at exit now and then, and the launcher
# then reports a rank killed by SIGABRT. The 20 slowest tests of each suite are printed at its end.
WORKERS ?= 2
PYTEST := $(BIN)/pytest -q -n $(WORKERS) --durations=20
pytest: $(VENV)/.installed
	$(PYTEST) -m "not dist and not ($(SLOW))"
	$(BIN)/pytest -q --durations=20 -m "dist and not ($(SLOW))"

# The sdist and wheel pass `twine check`; the wheel installs into a fresh venv (with torch pinned
# as TORCH_SPEC) and runs `paratrain --help`, `--version` and `doctor --quick`. 40-70 s on 2 cores,
# most of it pip, so it is part of `make test`; `pytest` above leaves it out (no double run).
release-test: $(VENV)/.installed
	TORCH_SPEC="$(TORCH_SPEC)" $(BIN)/pytest -q -m release

test: lint typecheck docs serve-deps pytest release-test

# `paratrain serve` is tested against a real sshd. As root (CI) this installs openssh-server and
# makes the unprivileged account the test logs in as (no home, no password, not locked); as
# another user it only says what is missing.
SERVE_USER := paratrain-ci
serve-deps:
	@if [ "$$(id -u)" = 0 ]; then \
		command -v sshd >/dev/null || [ -x /usr/sbin/sshd ] || \
			{ apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null; }; \
		id -u $(SERVE_USER) >/dev/null 2>&1 || useradd --no-create-home --shell /bin/bash $(SERVE_USER); \
		usermod -p '*' $(SERVE_USER); \
	elif ! { command -v sshd >/dev/null || [ -x /usr/sbin/sshd ]; }; then \
		echo "serve-deps: sshd is missing; install openssh-server (tests/serve fail without it)"; \
	fi

# Every shipped example (examples/) end to end at tiny size on 2 CPU ranks, and the notebook.
examples-test: $(VENV)/.installed
	$(PYTEST) -m examples

# The longest multi-rank runs of whole commands, two at a time: verify-resume over scripts (and
# its mutation-table sample), bench end to end, torchrun restarts, the pipeline port's restart,
# the demo's crash and the hang kinds (about 5 minutes; one at a time took 8). They ran one at a
# time while a rank that finished cleanly could abort at exit under that load ("terminate called
# without an active exception", SIGABRT): gloo's threads outliving a Run the script never closed,
# fixed since by closing it at interpreter exit. Called by CI.
e2e-test: $(VENV)/.installed
	$(PYTEST) -m e2e

# Past one machine's disk: 20 SIGKILLed savers against a real S3 API server (moto on loopback),
# streaming resume at 2 ranks x 2 workers (webdataset tars, HF datasets), trackers end to end.
scale-test: $(VENV)/.installed
	$(PYTEST) -m scale

# The verify-resume mutation table: every restart-safe script of tests/restart_mutants and every
# mutant with one planted restart defect, at 1 and 2 ranks (about 1.5 hours on 2 cores; not run by
# CI, which runs a sample of five in `make test`); the table goes to tests/restart_mutants/TABLE.md
# and the run fails on a false pass or a false alarm.
mutants-test: $(VENV)/.installed
	$(BIN)/python tests/restart_mutants/table.py tests/restart_mutants/TABLE.md

# Every layout (one process, ddp, fsdp, tp, fsdp x tp, hsdp, pipeline with each schedule, pp x dp,
# pp x tp) resumes from every other at 1, 2 and 4 CPU ranks: 255 resumes. Called by CI.
layouts-test: $(VENV)/.installed
	$(BIN)/pytest -q -m layouts

# The loop-shape corpus (tests/resume_corpus) killed once by SIGKILL from outside pt.Run and
# compared with an uninterrupted run, at 1 and 2 ranks: an independent check of what
# verify-resume proves in make examples-test; and verify-resume at 1 rank of the shapes CI checks
# at 2 ranks only. About 20 minutes; not run by CI.
kill-trials: $(VENV)/.installed
	$(BIN)/pytest -q -m kill_trials

# A real build of docker/Dockerfile (on a Debian base made here: no registry needed) and the serve
# smoke test inside the image. Root only; about 5 minutes. Not part of `make test`.
image-test: $(VENV)/.installed
	command -v buildah >/dev/null && command -v mmdebstrap >/dev/null && command -v podman >/dev/null \
		|| { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq buildah podman mmdebstrap curl >/dev/null; }
	PATH="$(CURDIR)/$(BIN):$$PATH" bash docker/image-test.sh

bench: $(VENV)/.installed
	$(BIN)/python benchmarks/overhead.py
	$(BIN)/python benchmarks/checkpoint_io.py

# The CUDA paths (run on a GPU machine, with a CUDA build of torch: TORCH_SPEC=torch).
cuda-check: $(VENV)/.installed
	$(BIN)/python benchmarks/cuda_paths.py

# Every GPU figure of the benchmarks page in one run (about 10 minutes on one GPU).
gpu-figures: $(VENV)/.installed
	PYTHON=$(BIN)/python bash benchmarks/gpu_figures.sh

clean:
	rm -rf $(VENV) runs site .pytest_cache .mypy_cache .ruff_cache
