"""GPU kernel benchmark: decode attention bandwidth and prefill-chunk TFLOP/s against torch SDPA in the same run.

Run by bench/gpu_check.sh on a CUDA machine (H200 targets: 4.8 TB/s HBM). Every time (`*_ms`) is taken with
the launch replayed from a CUDA graph, as the engine's decode graphs run it, so a small launch's host and
launch cost does not hide the kernel; the eager time (`*_eager_ms`) stands beside it. Prints Markdown
tables and writes JSON to --out (default $OUT/gpu_kernels.json, else ./artifacts/gpu_kernels.json) after
every case, so a run cut short keeps the cases before the cut (`"complete": false`).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

HBM_BYTES_PER_S = 4.8e12  # H200 peak
DEVICE = "cuda"
NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16
DECODE_BATCHES = (1, 16, 64, 256)
CONTEXTS = (1024, 4096, 16384)
# (batch, context, chunk): a chunk of new tokens at the end of its context; chunk == context is a fresh prefill.
PREFILL_CASES = [(b, ctx, 512) for b in (1, 16) for ctx in CONTEXTS] + [(1, 4096, 4096), (1, 16384, 16384)]
# torch SDPA on the same decode shape is timed up to this many context tokens in the batch (memory, time).
SDPA_DECODE_MAX_TOKENS = 1 << 20


def bench_ms(fn: Callable[[], Any]) -> tuple[float, float, str | None]:
    """Median milliseconds of `fn` replayed from a CUDA graph (`do_bench_cudagraph`: no launch or host cost,
    as the engine's decode graphs run it), the eager median beside it (`do_bench`: launches from Python
    each time), and why the graph was not timed (then the first figure is the eager one)."""
    import triton.testing

    eager = float(triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median"))
    try:
        graph = float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
    except Exception as exc:  # a launch that cannot be captured is reported, and timed eagerly
        return eager, eager, f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"
    return graph, eager, None


class PagedPool:
    """One bf16 paged K/V cache sized for the largest case, shared by all cases (blocks in shuffled order)."""

    def __init__(self, max_tokens: int, dtype: torch.dtype) -> None:
        num_blocks = max_tokens // BLOCK_SIZE
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k_cache = torch.randn(shape, dtype=dtype, device=DEVICE)
        self.v_cache = torch.randn(shape, dtype=dtype, device=DEVICE)
        self.order = torch.randperm(num_blocks, device=DEVICE).int()

    def tables(self, batch: int, context: int) -> torch.Tensor:
        """Block tables for `batch` sequences of `context` tokens each."""
        per_seq = context // BLOCK_SIZE
        return self.order[: batch * per_seq].view(batch, per_seq).contiguous()

    def gather(self, tables: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The same K/V as contiguous [batch, kv_heads, context, head_dim] tensors for SDPA."""
        batch = tables.shape[0]
        k = self.k_cache[tables.long()].reshape(batch, context, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = self.v_cache[tables.long()].reshape(batch, context, NUM_KV_HEADS, HEAD_DIM).transpose(1, 2)
        return k.contiguous(), v.contiguous()


def decode_case(pool: PagedPool, batch: int, context: int) -> dict[str, Any]:
    """Time one decode step (one query token per sequence) of the Triton kernel, and SDPA where it fits."""
    from fairserve_kernels.launch_heuristics import (
        launch_config,
        num_sms,
    )
    from fairserve_kernels.triton_attention import paged_attention

    dtype = pool.k_cache.dtype
    tables = pool.tables(batch, context)
    query = torch.randn(batch, NUM_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    scale = HEAD_DIM**-0.5

    def run() -> torch.Tensor:
        return paged_attention(
            query,
            pool.k_cache,
            pool.v_cache,
            tables,
            qsl,
            seq_lens,
            scale,
            max_query_len=1,
            max_seq_len=context,
        )

    ms, eager_ms, graph_error = bench_ms(run)
    kv_bytes = 2 * batch * context * NUM_KV_HEADS * HEAD_DIM * pool.k_cache.element_size()
    cfg = launch_config(
        num_tokens=batch,
        num_seqs=batch,
        num_kv_heads=NUM_KV_HEADS,
        group=NUM_HEADS // NUM_KV_HEADS,
        head_dim=HEAD_DIM,
        max_query_len=1,
        max_seq_len=context,
        sm_count=num_sms(query.device),
    )
    row: dict[str, Any] = {
        "batch": batch,
        "context": context,
        "num_splits": cfg.num_splits,
        "triton_ms": ms,
        "triton_eager_ms": eager_ms,
        "bandwidth_tb_s": kv_bytes / (ms * 1e-3) / 1e12,
        "hbm_fraction": kv_bytes / (ms * 1e-3) / HBM_BYTES_PER_S,
        "sdpa_ms": None,
        "sdpa_eager_ms": None,
        "max_abs_err_vs_sdpa": None,
        "graph_error": graph_error,
    }
    if batch * context <= SDPA_DECODE_MAX_TOKENS:
        k, v = pool.gather(tables, context)
        q4 = query.unsqueeze(2)  # [B, H, 1, D]

        def sdpa() -> torch.Tensor:
            return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

        row["sdpa_ms"], row["sdpa_eager_ms"], sdpa_error = bench_ms(sdpa)
        row["graph_error"] = row["graph_error"] or sdpa_error
        row["max_abs_err_vs_sdpa"] = (run().float() - sdpa().squeeze(2).float()).abs().max().item()
        del k, v
    return row


def prefill_case(pool: PagedPool, batch: int, context: int, chunk: int) -> dict[str, Any]:
    """Time a batch of prefill chunks (each the last `chunk` tokens of `context`) against SDPA, bottom-right causal."""
    from torch.nn.attention.bias import causal_lower_right

    from fairserve_kernels.launch_heuristics import (
        PREFILL_CANDIDATES,
        PrefillTiles,
        device_arch,
        prefill_tiles,
    )
    from fairserve_kernels.triton_attention import paged_attention

    dtype = pool.k_cache.dtype
    tables = pool.tables(batch, context)
    query = torch.randn(batch * chunk, NUM_HEADS, HEAD_DIM, dtype=dtype, device=DEVICE)
    qsl = torch.arange(batch + 1, dtype=torch.int32, device=DEVICE) * chunk
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device=DEVICE)
    scale = HEAD_DIM**-0.5

    def run(tiles: PrefillTiles | None = None) -> torch.Tensor:
        return paged_attention(
            query,
            pool.k_cache,
            pool.v_cache,
            tables,
            qsl,
            seq_lens,
            scale,
            max_query_len=chunk,
            max_seq_len=context,
            prefill=tiles,
        )

    # Every prefill candidate of this GPU's architecture, timed beside the heuristic's pick (issue 57).
    arch = device_arch(query.device)
    chosen = prefill_tiles(arch, HEAD_DIM, query.element_size())
    candidates_ms = {
        repr(tiles): bench_ms(functools.partial(run, tiles))[0] for tiles in PREFILL_CANDIDATES.get(arch, ())
    }
    group = NUM_HEADS // NUM_KV_HEADS
    k, v = pool.gather(tables, context)
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # MHA-shaped peer input
    q4 = query.view(batch, chunk, NUM_HEADS, HEAD_DIM).transpose(1, 2).contiguous()
    mask = causal_lower_right(chunk, context)

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q4, k, v, attn_mask=mask, scale=scale)

    pairs = chunk * (context - chunk) + chunk * (chunk + 1) // 2  # visible (query, key) pairs per head
    flops = 4.0 * batch * NUM_HEADS * HEAD_DIM * pairs
    (ms, eager_ms, graph_error), (sdpa_ms, sdpa_eager_ms, sdpa_error) = bench_ms(run), bench_ms(sdpa)
    err = (
        (run().float() - sdpa().transpose(1, 2).reshape(batch * chunk, NUM_HEADS, HEAD_DIM).float())
        .abs()
        .max()
    )
    return {
        "batch": batch,
        "context": context,
        "chunk": chunk,
        "triton_ms": ms,
        "triton_eager_ms": eager_ms,
        "sdpa_ms": sdpa_ms,
        "sdpa_eager_ms": sdpa_eager_ms,
        "graph_error": graph_error or sdpa_error,
        "triton_tflops": flops / (ms * 1e-3) / 1e12,
        "sdpa_tflops": flops / (sdpa_ms * 1e-3) / 1e12,
        "ratio_vs_sdpa": sdpa_ms / ms,
        "max_abs_err_vs_sdpa": err.item(),
        "chosen_tiles": repr(chosen),
        "candidates_ms": candidates_ms,
    }


def _fmt(value: Any, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.{digits}g}" if abs(value) < 1e-2 else f"{value:.{digits}f}"
    return str(value)


def markdown(rows: list[dict[str, Any]], columns: list[str]) -> str:
    """Rows as a Markdown table over `columns`."""
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def default_out() -> Path:
    """$OUT/gpu_kernels.json where the runner sets $OUT, else ./artifacts/gpu_kernels.json."""
    return Path(os.environ.get("OUT") or "artifacts") / "gpu_kernels.json"


def main(argv: list[str] | None = None) -> int:
    """Run every case, print the tables, write the JSON; exit 2 without CUDA."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--quick", action="store_true", help="only the batch 64 x 4k decode target and one prefill"
    )
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    decode_grid = [(64, 4096)] if args.quick else [(b, c) for b in DECODE_BATCHES for c in CONTEXTS]
    prefill_grid = PREFILL_CASES[:1] if args.quick else PREFILL_CASES
    max_tokens = max(max(b * c for b, c in decode_grid), max(b * c for b, c, _ in prefill_grid))
    pool = PagedPool(max_tokens, torch.bfloat16)
    out = args.out or default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    decode: list[dict[str, Any]] = []
    prefill: list[dict[str, Any]] = []
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "shape": {
            "num_heads": NUM_HEADS,
            "num_kv_heads": NUM_KV_HEADS,
            "head_dim": HEAD_DIM,
            "block_size": BLOCK_SIZE,
            "dtype": "bfloat16",
        },
        "hbm_bytes_per_s": HBM_BYTES_PER_S,
        "decode": decode,
        "prefill": prefill,
        "complete": False,
    }
    # Written after every case: a step cut by its time limit keeps what it measured.
    for b, c in decode_grid:
        decode.append(decode_case(pool, b, c))
        out.write_text(json.dumps(result, indent=2))
    for b, c, q in prefill_grid:
        prefill.append(prefill_case(pool, b, c, q))
        out.write_text(json.dumps(result, indent=2))
    target = next((r for r in decode if r["batch"] == 64 and r["context"] == 4096), None)
    result["target_decode_b64_4k_hbm_fraction"] = None if target is None else target["hbm_fraction"]
    result["target_met"] = None if target is None else target["hbm_fraction"] >= 0.70
    result["complete"] = True
    print("## Decode attention (bf16, 32 q heads, 8 kv heads, head_dim 128, block 16)\n")
    print(
        markdown(
            decode,
            [
                "batch",
                "context",
                "num_splits",
                "triton_ms",
                "triton_eager_ms",
                "bandwidth_tb_s",
                "hbm_fraction",
                "sdpa_ms",
                "sdpa_eager_ms",
                "max_abs_err_vs_sdpa",
            ],
        )
    )
    print("\n## Prefill-chunk attention vs torch SDPA (bottom-right causal)\n")
    print(
        markdown(
            prefill,
            [
                "batch",
                "context",
                "chunk",
                "triton_ms",
                "triton_eager_ms",
                "triton_tflops",
                "sdpa_ms",
                "sdpa_eager_ms",
                "sdpa_tflops",
                "ratio_vs_sdpa",
                "max_abs_err_vs_sdpa",
            ],
        )
    )
    if target is not None:
        verdict = "met" if result["target_met"] else "NOT met"
        print(f"\nTarget (decode b64 x 4k >= 70% of HBM): {target['hbm_fraction']:.1%} -> {verdict}")
    out.write_text(json.dumps(result, indent=2))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
