#!/usr/bin/env bash
# The whole suite: lint, types, layer check, tests. Called by `make test` and by .ci/run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=.venv/bin
export PYTHONHASHSEED=0
bash scripts/services.sh
bash scripts/ensure_chromium.sh
$BIN/ruff check .
$BIN/mypy
if [ -f ../shared/tools/check_layers.py ]; then python3 ../shared/tools/check_layers.py .; fi
$BIN/python -m pytest "$@"
