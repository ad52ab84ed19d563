#!/usr/bin/env bash
# The whole suite: lint, types, layer contracts (import-linter, pyproject.toml), tests. Called by `make test` and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONHASHSEED=0
bash scripts/services.sh
bash scripts/ensure_chromium.sh
$BIN/ruff format --check .
$BIN/ruff check .
$BIN/mypy
$BIN/lint-imports
$BIN/python -m pytest "$@"
