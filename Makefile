# One entry point for people and CI. Every target installs what it needs first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

# Python keeps its bytecode: an interpreter that imports torch, transformers and TRL spends ~11 s
# of CPU compiling their sources where it can read none (PYTHONDONTWRITEBYTECODE set, an install
# that compiled nothing), ~5 s with them (the suite starts hundreds; docs/TESTING.md). So uv
# compiles what it installs, and what make runs writes the caches of the rest.
unexport PYTHONDONTWRITEBYTECODE
export UV_COMPILE_BYTECODE := 1

.PHONY: setup setup-gpu docker install fit run judge-samples serve test test-models test-collective lint bench lock lock-gpu

$(VENV)/.installed: pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==0.13.9
	UV_FIND_LINKS="$${UV_FIND_LINKS:-$$(echo $${PIP_FIND_LINKS:-} | tr -s ' ' ',')}" $(BIN)/uv pip install --quiet --python $(BIN)/python -c constraints.txt -e ".[dev]"
	# DeepSpeed (--sharding zero3; its CPU parity test) publishes only a source release that
	# imports torch to build: built here against this venv's torch, without compiled ops (~10 s)
	$(BIN)/uv pip install --quiet --python $(BIN)/python setuptools
	DS_BUILD_OPS=0 $(BIN)/uv pip install --quiet --python $(BIN)/python --no-build-isolation -c constraints.txt deepspeed
	touch $@

setup: $(VENV)/.installed          ## the virtualenv with pinned dependencies

setup-gpu:                         ## a GPU worker's virtualenv: the gpu extra (vLLM), constraints-gpu.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check uv==0.13.9
	$(BIN)/uv pip install --python $(BIN)/python -c constraints-gpu.txt --override overrides-gpu.txt -e ".[gpu]"

docker:                            ## Docker engine running + sandbox image built (cached)
	bash infra/docker/install-engine.sh
	bash infra/sandbox-image/build.sh

# The virtualenv (uv: 17 s from an empty cache where pip took 1 min 57 s; pip's find-links, where
# set, carry over: pip separates them with spaces, uv with commas) and the Docker engine and
# sandbox image (apt, debootstrap: about a minute) install side by side, each one's output kept
# whole. The jobs stay inside this one step, so a target's own output (the flow's progress) streams.
install:                           ## setup and docker at once
	@$(MAKE) --no-print-directory --jobs=2 --output-sync=target setup docker

# The reference model's fit (CPU only, no sandbox; its time: docs/RESULTS.md, the fitted reference model)
# runs while the Docker engine and the sandbox image install (~80 s, mostly downloads); the flow
# then reuses the fitted model.
fit: setup                         ## the embedded reference model, fitted into ./runs (or reused)
	$(BIN)/python -m cobalt.reference

run:                               ## the main job: the whole pipeline on embedded defaults (./runs)
	@$(MAKE) --no-print-directory --jobs=2 --output-sync=target fit docker
	$(BIN)/python -m flows.pipeline

judge-samples: install             ## the sandbox vs. the APPS judge's labels on the bundled sample
	$(BIN)/python scripts/judge_samples.py

serve: install                     ## keep sandbox workers warm for every judge of this user (Ctrl-C stops)
	$(BIN)/python -m sandbox serve

# The models the tests share (tests/shared_models.py; the fitted reference is ~4 minutes of CPU,
# cached per machine) and DeepSpeed's CPU collective (a minute of one core) build side by side while
# the Docker engine and the sandbox image install; the suite then runs on TEST_WORKERS processes
# (pytest-xdist; docs/TESTING.md: three on two cores, a third working while the others wait on
# servers, rendezvous and sandboxes) and prints its slowest tests.
TEST_WORKERS ?= 3
test-models: setup                 ## build (or reuse) the models the tests share
	$(BIN)/python tests/shared_models.py models

test-collective: setup             ## compile (or reuse) DeepSpeed's CPU collective for the tests
	$(BIN)/python tests/shared_models.py deepspeed

test:                              ## the test-suite (real Docker, real sandbox), on 2 cores
	@$(MAKE) --no-print-directory --jobs=3 --output-sync=target test-models test-collective docker
	COBALT_REQUIRE_DOCKER=1 $(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --durations=25

lint: setup
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

bench: install                     ## sandbox throughput vs. peers (see docs/BENCHMARKS.md)
	command -v bwrap >/dev/null || { apt-get update -qq && apt-get install -y -qq bubblewrap; }  # the Cobalt-style peer
	$(BIN)/python -m benchmarks.sandbox_throughput

lock:                              ## re-pin constraints.txt from the current virtualenv
	$(BIN)/pip freeze --exclude-editable | grep -v '^-e' > constraints.txt

lock-gpu: setup                    ## re-resolve constraints-gpu.txt (python 3.12, x86_64 Linux; needs the index)
	{ head -2 constraints-gpu.txt; $(BIN)/uv pip compile pyproject.toml --extra gpu --override overrides-gpu.txt \
	  --python-version 3.12 --python-platform x86_64-manylinux_2_28 --no-annotate --no-header -q; } > constraints-gpu.txt.new
	mv constraints-gpu.txt.new constraints-gpu.txt
