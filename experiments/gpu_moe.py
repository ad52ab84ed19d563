"""Fused-MoE kernel check on CUDA: the Triton grouped GEMM against the torch path, same inputs, same run.

Qwen3-30B-A3B's expert shapes (hidden 2048, expert inter 768, 128 experts, top 8) in bf16, for batches
of 1 to 4096 tokens: the largest difference from the torch path (fp32 math on the same bf16 weights),
median milliseconds of each and the kernel's TFLOP/s. Run by bench/gpu_check.sh; on a machine without
CUDA it says so and measures nothing (exit 0), so the script can be rehearsed anywhere.

    .venv/bin/python -m experiments.gpu_moe --out artifacts/gpu_moe.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import torch

HIDDEN, INTER, EXPERTS, TOP_K = 2048, 768, 128, 8
TOKENS = (1, 16, 64, 512, 4096)


def _inputs(tokens: int, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    from fairserve_kernels.moe_reference import route

    x = torch.randn(tokens, HIDDEN, generator=gen)
    w13 = torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=gen) * HIDDEN**-0.5
    w2 = torch.randn(EXPERTS, HIDDEN, INTER, generator=gen) * INTER**-0.5
    weights, ids = route(torch.randn(tokens, EXPERTS, generator=gen), TOP_K, normalise=True)
    return tuple(t.cuda() for t in (x.bfloat16(), w13.bfloat16(), w2.bfloat16(), weights.bfloat16(), ids))


def measure(tokens: int) -> dict[str, Any]:
    """One batch size: error against the torch path (in fp32) and both timings."""
    import triton.testing

    from fairserve_kernels.moe_reference import fused_moe_ref
    from fairserve_kernels.triton_moe import fused_moe

    x, w13, w2, weights, ids = _inputs(tokens, torch.Generator().manual_seed(tokens))
    got = fused_moe(x, w13, w2, weights, ids).float()
    expected = fused_moe_ref(x.float(), w13.float(), w2.float(), weights.float(), ids)
    err = float((got - expected).abs().max() / expected.abs().max())
    triton_ms = float(
        triton.testing.do_bench(lambda: fused_moe(x, w13, w2, weights, ids), return_mode="median")
    )
    torch_ms = float(
        triton.testing.do_bench(lambda: fused_moe_ref(x, w13, w2, weights, ids), return_mode="median")
    )
    flops = 2 * tokens * TOP_K * (2 * INTER * HIDDEN + HIDDEN * INTER)
    return {
        "tokens": tokens,
        "max_rel_err": err,
        "triton_ms": triton_ms,
        "torch_ms": torch_ms,
        "triton_tflops": flops / triton_ms / 1e9,
        "speedup": torch_ms / triton_ms,
    }


def main(argv: list[str] | None = None) -> int:
    """Measure every batch size, print a Markdown table, write JSON; fail when the kernel disagrees."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    default_out = Path(os.environ.get("OUT", "artifacts")) / "gpu_moe.json"
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--quick", action="store_true", help="the three smallest batch sizes only")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print(
            "no CUDA device: the fused-MoE GPU check is skipped (tests/fairserve_kernels/test_triton_moe.py runs it "
            "under the interpreter)"
        )
        return 0
    rows = [measure(t) for t in (TOKENS[:3] if args.quick else TOKENS)]
    print(f"## Fused MoE, bf16, hidden {HIDDEN}, expert inter {INTER}, {EXPERTS} experts, top {TOP_K}\n")
    print(
        "| tokens | max rel err | Triton ms | torch ms | Triton TFLOP/s | speed-up |\n|---:|---:|---:|---:|---:|---:|"
    )
    for r in rows:
        print(
            f"| {r['tokens']} | {r['max_rel_err']:.1e} | {r['triton_ms']:.3f} | {r['torch_ms']:.3f} "
            f"| {r['triton_tflops']:.1f} | {r['speedup']:.1f}x |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "rows": rows}, indent=2) + "\n")
    return 0 if all(r["max_rel_err"] < 2e-2 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
