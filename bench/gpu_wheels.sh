#!/usr/bin/env bash
# The wheels bench/gpu_check.sh needs on a bare CUDA machine (Python 3.12, torch + triton + transformers,
# no registry), listed in bench/gpu_wheels.txt: fetched here for cp312 manylinux x86_64, no dependencies,
# into ./wheels (or $1).
# Carry that folder with the tree; gpu_check.sh installs it with pip --no-index --no-deps --target.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST="${1:-./wheels}"
mkdir -p "$DEST"
PIP="${PIP:-.venv/bin/pip}"
$PIP download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    -d "$DEST" \
    $(grep -v '^\s*#' bench/gpu_wheels.txt)
ls "$DEST"
