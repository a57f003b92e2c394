# Everything a fresh machine needs: `make run` and `make test` set up the venv, the pinned
# packages and the dataset on their own.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
FASHION_MNIST_DIR := .cache/fashion-mnist
DATASET_STAMP := $(FASHION_MNIST_DIR)/.verified
PYTEST_ARGS ?=
# `make test` and `make test-fast` share the suite out over this many processes (pytest-xdist,
# whole files each; 0 runs it in pytest's own process).
TEST_PROCESSES ?= 2
# The edit-test loop: no training cluster, luigi run, container or full-dataset build.
FAST_TESTS := not e2e and not docker and not slow

export TF_USE_LEGACY_KERAS := 1
export TF_CPP_MIN_LOG_LEVEL := 2

.PHONY: setup dataset run test test-fast lint typecheck bench docs clean clean-runs nightly-demo \
	simulate

setup: $(STAMP)

# uv installs the lock (the exact versions, no resolving, bytecode compiled as pip would) in
# seconds where pip takes a minute; the venv keeps pip for users' own installs.
UV_VERSION := 0.13.9
UV := $(BIN)/uv pip install -q --python $(BIN)/python --no-deps

$(STAMP): requirements.lock requirements-dev.lock pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check uv==$(UV_VERSION)
	$(UV) --compile-bytecode -r requirements.lock -r requirements-dev.lock
	$(UV) --no-build-isolation -e .
	touch $@

dataset: $(DATASET_STAMP)

$(DATASET_STAMP): preprocess/sources/fashion_mnist.sha256 preprocess/sources/fetch_fashion_mnist.sh
	bash preprocess/sources/fetch_fashion_mnist.sh $(FASHION_MNIST_DIR)
	touch $@

run: setup dataset
	$(BIN)/luigi --module pipeline FullRun --local-scheduler

# Several consecutive nights on growing daily drops, warm-started from the last blessed model,
# in their own output root (tools/nightly_demo.py; docs/operations.md). A few minutes as set
# here; e.g. `make nightly-demo DAYS=5 EPOCHS=10 MODEL=cnn3`, or DEMO_ARGS=--recipe for
# luigi.cfg's recipe on the whole train split. A rerun with the same settings continues.
DAYS ?= 3
EPOCHS ?=
MODEL ?=
PER_DAY ?=
DEMO_ROOT ?= runs-demo
DEMO_ARGS ?=

nightly-demo: setup dataset
	$(BIN)/python -m tools.nightly_demo --root $(DEMO_ROOT) --days $(DAYS) \
		$(if $(EPOCHS),--epochs $(EPOCHS)) $(if $(MODEL),--model $(MODEL)) \
		$(if $(PER_DAY),--per-day $(PER_DAY)) $(DEMO_ARGS)

# A year of nights, simulated: consecutive nights on small daily drops with faults injected
# (killed stages, bad drops, a worse model, a missed night, a rollback, a full disk), every night
# checked (pipeline/simulate.py; docs/operations.md). NIGHTS=60 took 18 to 45 minutes on
# 2-core VMs; as root the output root is a tmpfs. SIM_ROOT is replaced when it holds an earlier
# simulation; e.g. `make simulate NIGHTS=7 SIM_ARGS=--faults=2:kill-train`.
NIGHTS ?= 60
SIM_ROOT ?= runs-simulation
SIM_ARGS ?=

simulate: setup dataset
	$(BIN)/python -m pipeline.simulate --nights $(NIGHTS) --root $(SIM_ROOT) $(SIM_ARGS)

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy contract pipeline preprocess train evaluate bench tools

# The lint and the type check run beside the suite, on the core the suite's start leaves idle;
# their output follows the suite's, and `make test` fails when any of the three fails.
CHECKS_LOG := .cache/checks.log

# The project's own modules compiled once: the suite starts a few hundred Python programs,
# and where PYTHONDONTWRITEBYTECODE is set each of them would compile every module it imports.
PACKAGES := contract pipeline preprocess train evaluate bench tools examples tests
.PHONY: bytecode
bytecode: setup
	@$(BIN)/python -m compileall -q -j 0 $(PACKAGES)

test: setup dataset bytecode
	@mkdir -p $(dir $(CHECKS_LOG))
	@$(MAKE) --no-print-directory lint typecheck > $(CHECKS_LOG) 2>&1 & checks=$$!; \
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile $(PYTEST_ARGS); suite=$$?; \
	wait $$checks; lint=$$?; \
	echo "--- make lint typecheck:"; cat $(CHECKS_LOG); \
	if [ $$lint -ne 0 ]; then echo "make test: the lint or the type check failed (above)" >&2; fi; \
	[ $$suite -eq 0 ] && [ $$lint -eq 0 ]

test-fast: setup dataset bytecode
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile -m "$(FAST_TESTS)" $(PYTEST_ARGS)

bench: setup dataset
	$(BIN)/python -m bench

# docs/configuration.md, from the parameters' declarations (tests/test_config_doc.py checks it).
docs: setup
	$(BIN)/python -m pipeline.config_doc --output docs/configuration.md

# A local Dask cluster for `python -m preprocess run --runner=DaskRunner --dask_client_address=...`.
WORKERS ?= 2
.PHONY: dask-up dask-down
dask-up: setup
	$(BIN)/python -m preprocess.dask_cluster start --workers $(WORKERS)

dask-down:
	$(BIN)/python -m preprocess.dask_cluster stop

# The venv and caches only: runs/ holds the models and the blessing history and is never
# removed here. `make clean-runs` deletes it, and says so.
clean:
	rm -rf $(VENV) .cache build *.egg-info .pytest_cache .ruff_cache .mypy_cache bench/results

clean-runs:
	@echo "deleting runs/: every run's shards, models, metrics and runs/latest.json"
	rm -rf runs

# Docker: the offline base (mmdebstrap + docker import, as root), then the stages' image on it.
# `BASE_IMAGE=python:3.11-slim make docker-image` builds on the ordinary public base instead.
IMAGE ?= nightly-trainer:latest
BASE_IMAGE ?= nightly-trainer/base:bookworm
.PHONY: docker-base docker-image docker-assemble

docker-base:
	bash docker/make_base_image.sh $(BASE_IMAGE)

docker-image:
	BASE_IMAGE=$(BASE_IMAGE) bash docker/build_image.sh $(IMAGE)

# The same image for an engine on fuse-overlayfs: the lock installed outside Docker's layers.
docker-assemble: setup
	BASE_IMAGE=$(BASE_IMAGE) bash docker/assemble_image.sh $(IMAGE)
