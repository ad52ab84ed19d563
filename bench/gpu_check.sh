#!/usr/bin/env bash
# The one prepared GPU check (an H200; well under 10 minutes): kernel correctness on CUDA against the
# torch reference (bf16 included), decode bandwidth and prefill TFLOP/s against SDPA, the fused-MoE
# kernel against its torch path, and engine decode throughput against transformers. Results (Markdown + JSON) go to $OUT, else ./artifacts.
# Usage: bash bench/gpu_check.sh [--quick]      (PYTHON=... to pick the interpreter)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${OUT:-./artifacts}"
mkdir -p "$OUT_DIR"
if [ -z "${PYTHON:-}" ]; then
    # The repo's venv when it sees a GPU, else the machine's own python3 (the device image's torch + triton).
    if [ -x .venv/bin/python ] && .venv/bin/python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
        PYTHON=.venv/bin/python
    else
        PYTHON=python3
    fi
fi
QUICK="${1:-}"
unset TRITON_INTERPRET
status=0
step() {  # step NAME SECONDS CMD...: run with a time limit, log to $OUT_DIR/NAME.log, remember failures
    local name=$1 limit=$2; shift 2
    echo "=== $name (limit ${limit}s) ==="
    local start=$SECONDS
    timeout "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
    local rc=${PIPESTATUS[0]}
    echo "=== $name: rc=$rc, $((SECONDS - start))s ==="
    [ "$rc" -eq 0 ] || status=1
}
nvidia-smi -L || true
$PYTHON -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__, torch.cuda.get_device_name())'
step kernel_tests 200 $PYTHON -m pytest tests/fairserve_kernels -q -p no:cacheprovider -o addopts="" -rs
step gpu_kernels 200 $PYTHON -m experiments.gpu_kernels --out "$OUT_DIR/gpu_kernels.json" $QUICK
step gpu_moe 90 $PYTHON -m experiments.gpu_moe --out "$OUT_DIR/gpu_moe.json" $QUICK
if [ "$QUICK" != "--quick" ]; then
    step gpu_engine 180 $PYTHON -m experiments.gpu_engine --out "$OUT_DIR/gpu_engine.json"
fi
exit $status
