"""GPU engine benchmark: decode throughput of `engine.LLM` (Triton backend) against transformers `generate()`.

Both serve the same random-weight ~0.85B-parameter Llama (written with transformers into a temp dir,
plus the engine's byte-level tokenizer) at batch 1, 64 and 256, in the same run; the engine with CUDA
graphs and with `enforce_eager`. Decode throughput is batch * (N - 1) / (t(N new tokens) - t(1 new
token)), so prefill and start-up cancel out. At batch 64, torch.profiler gives the decode step's
GPU-busy fraction (summed kernel time over wall time of a steady decode run) and kernel launches
per step. Prints a Markdown table; writes JSON to --out (default $OUT/gpu_engine.json, else ./artifacts/)
after every row, so a run cut by its time limit keeps the rows before the cut (`"complete": false`).

A graphs row whose engine captured no decode graph (a failed capture falls back to eager with one warning
line) or replayed none in its timed runs would report eager figures as graph figures: it is an error row,
and the run exits 1 naming it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

BATCHES, PROMPT_LEN, NEW_TOKENS = (1, 64, 256), 128, 128
PROFILED_BATCH, PROFILED_TOKENS = 64, 16
# TinyLlama-like geometry with 16 layers: about 0.85B parameters.
MODEL_GEOMETRY: dict[str, Any] = {
    "hidden_size": 2048,
    "intermediate_size": 5632,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 32000,
    "max_position_embeddings": 4096,
}


def write_model(path: Path) -> Any:
    """Save a random-weight bf16 Llama and the byte tokenizer to `path`; return the model (on CUDA) for the peer."""
    from transformers import LlamaConfig, LlamaForCausalLM

    try:
        from engine.core.byte_tokenizer import write_byte_tokenizer
    except ImportError:
        from engine.core.byte_tokenizer import write_byte_tokenizer
    config = LlamaConfig(
        **MODEL_GEOMETRY, bos_token_id=256, eos_token_id=257, pad_token_id=258, tie_word_embeddings=False
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model: Any = LlamaForCausalLM(config)
    model = model.to(torch.bfloat16).eval()
    model.save_pretrained(path)
    write_byte_tokenizer(path)
    return model


def timed(fn: Callable[[], Any]) -> float:
    """Wall seconds of `fn`, with the GPU drained before and after."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - start


def decode_tps(run: Callable[[int], Any], batch: int) -> dict[str, float]:
    """Decode tokens/s from a 1-token and an N-token run (after a warm-up that compiles kernels)."""
    run(4)
    t1 = timed(lambda: run(1))
    tn = timed(lambda: run(NEW_TOKENS))
    step_ms = (tn - t1) / (NEW_TOKENS - 1) * 1e3
    return {
        "t_1_s": t1,
        "t_n_s": tn,
        "step_ms": step_ms,
        "decode_tokens_per_s": batch * (NEW_TOKENS - 1) / max(tn - t1, 1e-9),
    }


def profile_decode(run: Callable[[int], Any]) -> dict[str, float]:
    """GPU-busy fraction and kernel launches per step of a decode run, from torch.profiler.

    The difference of a PROFILED_TOKENS run and a 1-token run isolates the decode steps from the
    prefill, as `decode_tps` does for time: busy = kernel time / wall time of those steps.
    """
    from torch.profiler import DeviceType, ProfilerActivity, profile

    def measure(n: int) -> tuple[float, float, int]:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            wall = timed(lambda: run(n))
        kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
        busy_us = sum(e.device_time for e in kernels)
        return wall * 1e6, busy_us, len(kernels)

    run(4)
    wall_1, busy_1, launches_1 = measure(1)
    wall_n, busy_n, launches_n = measure(PROFILED_TOKENS)
    steps = PROFILED_TOKENS - 1
    return {
        "gpu_busy_fraction": (busy_n - busy_1) / max(wall_n - wall_1, 1e-9),
        "kernel_launches_per_step": (launches_n - launches_1) / steps,
    }


class GraphsNotCaptured(RuntimeError):
    """Graphs were asked for and the engine has none, or replayed none: its figures would be eager ones."""


def engine_run(
    model_dir: Path, prompts: list[list[int]], backend: str, eager: bool, device: str = "cuda"
) -> Callable[[int], Any]:
    """A function generating `n` tokens for every prompt with `engine.LLM` on `backend`; with graphs
    (`eager` false), one that raises `GraphsNotCaptured` unless every call replayed a decode graph."""
    from engine import LLM, SamplingParams

    batch = len(prompts)
    llm = LLM(
        model=str(model_dir),
        device=device,
        dtype="bfloat16",
        attention_backend=backend,
        max_num_seqs=batch,
        max_num_batched_tokens=max(batch * PROMPT_LEN, 2048),
        enable_prefix_caching=False,
        kv_cache_memory_fraction=0.3,
        enforce_eager=eager,
    )

    graphs = llm.engine.runner.graphs
    if not eager and graphs is None:
        raise GraphsNotCaptured("CUDA graphs were asked for and not captured (see the capture warning)")

    def run(n: int) -> Any:
        replayed = graphs.replayed_steps if graphs is not None else 0
        outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        assert all(len(o.token_ids) == n for o in outs), "engine stopped early"
        if graphs is not None and n > 1 and graphs.replayed_steps == replayed:
            raise GraphsNotCaptured(f"{n} tokens a request and no decode step replayed a graph")
        return outs

    return run


def hf_run(model: Any, prompts: list[list[int]]) -> Callable[[int], Any]:
    """A function generating `n` tokens for every prompt with transformers `generate()` (greedy, KV cache)."""
    input_ids = torch.tensor(prompts, device="cuda")
    mask = torch.ones_like(input_ids)

    def run(n: int) -> Any:
        with torch.inference_mode():
            return model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=n,
                min_new_tokens=n,
                do_sample=False,
                pad_token_id=258,
            )

    return run


def _engine_rows(model_dir: Path, prompts: list[list[int]], backend: str, batch: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for eager in (False, True) if backend == "triton" else (True,):
        system = f"engine.LLM ({backend}{', eager' if eager else ', graphs'})"
        try:
            run = engine_run(model_dir, prompts, backend, eager)
            row: dict[str, Any] = {"system": system, "batch": batch, **decode_tps(run, batch)}
            if batch == PROFILED_BATCH:
                row.update(profile_decode(run))
            rows.append(row)
            del run
        except GraphsNotCaptured as exc:  # an error row, and the run fails (main)
            rows.append(
                {"system": system, "batch": batch, "error": f"{type(exc).__name__}: {exc}", "fatal": True}
            )
        except Exception as exc:  # report and keep the other measurements
            rows.append({"system": system, "batch": batch, "error": f"{type(exc).__name__}: {exc}"})
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    """Measure the engine (graphs and eager; Triton and torch backends) and transformers; print and write."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip-torch-backend", action="store_true")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_engine: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    out = args.out or Path(os.environ.get("OUT") or "artifacts") / "gpu_engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(1)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        model = write_model(model_dir)
        params = sum(p.numel() for p in model.parameters())
        for batch in args.batches:
            prompts = torch.randint(0, 256, (batch, PROMPT_LEN), generator=gen).tolist()
            rows.append(
                {
                    "system": "transformers generate()",
                    "batch": batch,
                    **decode_tps(hf_run(model, prompts), batch),
                }
            )
            write(out, payload(rows, params, complete=False))
        del model
        torch.cuda.empty_cache()
        for batch in args.batches:
            prompts = torch.randint(0, 256, (batch, PROMPT_LEN), generator=gen).tolist()
            rows += _engine_rows(model_dir, prompts, "triton", batch)
            write(out, payload(rows, params, complete=False))
            if not args.skip_torch_backend and batch == PROFILED_BATCH:
                rows += _engine_rows(
                    model_dir, prompts, "torch", batch
                )  # eager: the twins cannot be captured
                write(out, payload(rows, params, complete=False))
    peers = {r["batch"]: r["decode_tokens_per_s"] for r in rows if r["system"].startswith("transformers")}
    for row in rows:
        if "decode_tokens_per_s" in row and peers.get(row["batch"]):
            row["ratio_vs_transformers"] = row["decode_tokens_per_s"] / peers[row["batch"]]
    print(
        f"## Engine decode throughput: {params / 1e9:.2f}B-param random Llama, bf16, "
        f"prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens\n"
    )
    print(
        "| system | batch | decode tok/s | ratio vs transformers | step ms | GPU busy | launches/step | error |\n"
        "|---|---|---|---|---|---|---|---|"
    )
    for row in rows:
        busy = f"{row['gpu_busy_fraction']:.0%}" if "gpu_busy_fraction" in row else ""
        launches = f"{row['kernel_launches_per_step']:.0f}" if "kernel_launches_per_step" in row else ""
        print(
            f"| {row['system']} | {row['batch']} | {row.get('decode_tokens_per_s', 0):.0f} "
            f"| {row.get('ratio_vs_transformers', 0):.2f} | {row.get('step_ms', 0):.2f} | {busy} | {launches} "
            f"| {row.get('error', '')} |"
        )
    write(out, payload(rows, params, complete=True))
    print(f"\nwrote {out}")
    fatal = [f"{r['system']} at batch {r['batch']}: {r['error']}" for r in rows if r.get("fatal")]
    for line in fatal:
        print(f"FAILED: {line}", file=sys.stderr)
    return 1 if fatal else 0


def payload(rows: list[dict[str, Any]], params: int, complete: bool) -> dict[str, Any]:
    """The JSON document of the rows measured so far."""
    return {
        "device": torch.cuda.get_device_name(),
        "params": params,
        "prompt_len": PROMPT_LEN,
        "new_tokens": NEW_TOKENS,
        "complete": complete,
        "rows": rows,
    }


def write(out: Path, document: dict[str, Any]) -> None:
    """Replace `out` with `document` (after every row: a cut run keeps what it measured)."""
    out.write_text(json.dumps(document, indent=2))


if __name__ == "__main__":
    sys.exit(main())
