# Two commands: `make serve` (the serving install) and `make test` (adds the dev tools and Ray). Both build .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test lint bench bench-litellm clean

SERVE_STAMP := $(VENV)/.installed-serve
ARGS ?=

# The serving install: what `fairserve serve` needs, no test tools, no Ray (README "Quick start").
$(SERVE_STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch first, pinned to the CPU build on disk, so nothing pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e .
	touch $(SERVE_STAMP)

$(STAMP): $(SERVE_STAMP) pyproject.toml fairserve_client/pyproject.toml
	$(BIN)/pip install -q -e '.[dev,ray]'  # ray: the tests of cluster/ (fairserve ray) run in CI
	# The client is a distribution of its own (openai is its only dependency; see its pyproject.toml).
	$(BIN)/pip install -q -e ./fairserve_client
	touch $(STAMP)

# `make serve ARGS="--host 0.0.0.0 --port 9000"`: any flag of `fairserve serve` (or FAIRSERVE_HOST, FAIRSERVE_PORT).
serve: $(SERVE_STAMP)
	$(BIN)/fairserve serve --print-secrets $(ARGS)  # the demo key printed even through a pipe

test: $(STAMP)
	bash scripts/test.sh

bench: $(STAMP)
	$(BIN)/fairserve bench --quick --out artifacts/bench
	# Gateway CPU per request against a bare Starlette app (and that app paced as an engine paces a gateway): a change that doubles the ratio shows here.
	$(BIN)/python -m bench.gateway_cpu --rounds 2 --requests 400

# litellm's proxy pins versions that clash with transformers 5, so it gets a virtualenv of its own.
.venv-litellm/bin/litellm:
	$(PY) -m venv .venv-litellm
	.venv-litellm/bin/pip install -q 'litellm[proxy]!=1.82.7,!=1.82.8'

bench-litellm: $(STAMP) .venv-litellm/bin/litellm
	FAIRSERVE_LITELLM_BIN=.venv-litellm/bin/litellm $(BIN)/fairserve bench --quick --out artifacts/bench

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/mypy && $(BIN)/lint-imports

clean:
	rm -rf $(VENV) .venv-litellm .pytest_cache .mypy_cache .ruff_cache
