#!/usr/bin/env bash
# The one prepared GPU check (one H100/H200; the step limits add up to 420 s, inside a 600 s command): the
# compile gate for sm_90/sm_80 (with each cubin's registers, spills and shared memory against the limits),
# kernel correctness on CUDA against the torch twins (bf16 included), decode bandwidth and prefill TFLOP/s
# against SDPA (timed under a CUDA graph, the eager time beside), the fused-MoE kernel against its torch
# path, and engine decode throughput at batch 1, 64 and 256 with and without CUDA graphs against
# transformers, with the GPU-busy fraction and kernel launches per decode step from torch.profiler.
# Results: $OUT (else ./artifacts)/gpu_check.md and gpu_check.json, plus each step's log and JSON. Every
# step's JSON, and gpu_check.json, are written as soon as that step ends: a run cut short keeps the steps
# before the cut (tests/bench/test_gpu_check.py holds the limits, the steps and their imports).
#
# Usage: bash bench/gpu_check.sh [--quick]      (PYTHON=... to pick the interpreter)
#
# On a bare CUDA machine whose Python (3.12) has torch, triton, transformers and pytest but nothing of ours
# and no package registry, bring the cp312 manylinux wheels of bench/gpu_wheels.txt (no dependencies beyond
# them), in a folder carried with the tree, named by FAIRSERVE_WHEELS (default ./wheels).
# Fetch them on any machine with a registry:  bash bench/gpu_wheels.sh   (writes ./wheels)
# This script installs them with  pip install --no-index --no-deps --target "$WHEELS_DIR/site" wheels/*.whl
# and puts that folder on PYTHONPATH; nothing else is installed.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-./artifacts}"
mkdir -p "$OUT_DIR"
WHEELS="${FAIRSERVE_WHEELS:-./wheels}"
if [ -z "${PYTHON:-}" ]; then
    # The repo's venv when it sees a GPU, else the machine's own python3 (the device image's torch + triton).
    if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PYTHON=.venv/bin/python
    else
        PYTHON=python3
    fi
fi
if ! $PYTHON -c 'import zmq, msgspec, pydantic_settings, tenacity, redis, hypothesis' 2>/dev/null && [ -d "$WHEELS" ]; then
    SITE="$(mktemp -d)/site"
    $PYTHON -m pip install -q --no-index --no-deps --target "$SITE" "$WHEELS"/*.whl
    export PYTHONPATH="$SITE:${PYTHONPATH:-}"
fi
export PYTHONPATH="$PWD:${PYTHONPATH:-}"
QUICK="${1:-}"
unset TRITON_INTERPRET
status=0
SUMMARY="$OUT_DIR/gpu_check.md"
STEPS_JSON=""
echo "# GPU check $(date -u +%FT%TZ)" > "$SUMMARY"
write_json() {  # gpu_check.json as it stands: rewritten after every step, so a cut run keeps the others
    echo "{\"status\":$status,\"steps\":[$STEPS_JSON]}" > "$OUT_DIR/gpu_check.json"
}
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT_DIR/NAME.log, remember failures
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s) ==="
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    local took=$((SECONDS - start))
    echo "=== $name: rc=$rc, ${took}s ==="
    [ "$rc" -eq 0 ] || status=1
    { echo; echo "## $name (rc=$rc, ${took}s)"; echo; grep -v '^\s*$' "$OUT_DIR/$name.log" | tail -40; } >> "$SUMMARY"
    STEPS_JSON="$STEPS_JSON${STEPS_JSON:+,}{\"step\":\"$name\",\"rc\":$rc,\"seconds\":$took}"
    write_json
}
nvidia-smi -L || true
$PYTHON -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())' | tee -a "$SUMMARY"
JOBS=$(nproc)
write_json
# The gate over the pairwise cover of the variants the launches choose (its own step: the pytest of it
# would rerun the whole gate in one process). The kernel tests leave that file out.
step compile_gate 60 $PYTHON -m fairserve_kernels.compile_gate --jobs "$JOBS" --json "$OUT_DIR/compile_gate.json"
step kernel_tests 90 $PYTHON -m pytest tests/fairserve_kernels --ignore=tests/fairserve_kernels/test_compile_gate.py -q -p no:cacheprovider -o addopts="" -rs
step gpu_kernels 80 $PYTHON -m experiments.gpu_kernels --out "$OUT_DIR/gpu_kernels.json" $QUICK
step gpu_moe 40 $PYTHON -m experiments.gpu_moe --out "$OUT_DIR/gpu_moe.json" $QUICK
if [ "$QUICK" != "--quick" ]; then
    step gpu_engine 150 $PYTHON -m experiments.gpu_engine --out "$OUT_DIR/gpu_engine.json"
fi
echo "wrote $SUMMARY and $OUT_DIR/gpu_check.json"
exit $status
