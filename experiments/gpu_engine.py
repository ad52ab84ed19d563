"""GPU engine benchmark: decode throughput of `engine.LLM` (Triton backend) against transformers `generate()`.

Both serve the same random-weight ~0.85B-parameter Llama (written with transformers into a temp dir,
plus the engine's byte-level tokenizer) at batch 64, in the same run. Decode throughput is
batch * (N - 1) / (t(N new tokens) - t(1 new token)), so prefill and start-up cancel out.
Prints a Markdown table; writes JSON to --out (default $OUT/gpu_engine.json, else ./artifacts/).
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

BATCH, PROMPT_LEN, NEW_TOKENS = 64, 128, 128
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
        from engine.tokenizer import write_byte_tokenizer
    except ImportError:
        from engine.tokenizer import write_byte_tokenizer
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


def decode_tps(run: Callable[[int], Any]) -> dict[str, float]:
    """Decode tokens/s from a 1-token and an N-token run (after a warm-up that compiles kernels)."""
    run(4)
    t1 = timed(lambda: run(1))
    tn = timed(lambda: run(NEW_TOKENS))
    return {"t_1_s": t1, "t_n_s": tn, "decode_tokens_per_s": BATCH * (NEW_TOKENS - 1) / max(tn - t1, 1e-9)}


def engine_run(model_dir: Path, prompts: list[list[int]], backend: str) -> Callable[[int], Any]:
    """A function generating `n` tokens for every prompt with `engine.LLM` on `backend`."""
    from engine import LLM, SamplingParams

    llm = LLM(
        model=str(model_dir),
        device="cuda",
        dtype="bfloat16",
        attention_backend=backend,
        max_num_seqs=BATCH,
        max_num_batched_tokens=BATCH * PROMPT_LEN,
        enable_prefix_caching=False,
        kv_cache_memory_fraction=0.3,
    )

    def run(n: int) -> Any:
        outs = llm.generate(prompts, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
        assert all(len(o.token_ids) == n for o in outs), "engine stopped early"
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


def main(argv: list[str] | None = None) -> int:
    """Measure the engine (Triton and torch backends) and transformers; print and write the results."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--skip-torch-backend", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_engine: no CUDA device; nothing measured", file=sys.stderr)
        return 2
    gen = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, 256, (BATCH, PROMPT_LEN), generator=gen).tolist()
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp)
        model = write_model(model_dir)
        params = sum(p.numel() for p in model.parameters())
        rows.append({"system": "transformers generate()", **decode_tps(hf_run(model, prompts))})
        del model
        torch.cuda.empty_cache()
        backends = ["triton"] if args.skip_torch_backend else ["triton", "torch"]
        for backend in backends:
            try:
                rows.append(
                    {
                        "system": f"engine.LLM ({backend})",
                        **decode_tps(engine_run(model_dir, prompts, backend)),
                    }
                )
            except Exception as exc:  # report and keep the other measurements
                rows.append({"system": f"engine.LLM ({backend})", "error": f"{type(exc).__name__}: {exc}"})
            torch.cuda.empty_cache()
    peer = rows[0]["decode_tokens_per_s"]
    for row in rows:
        if "decode_tokens_per_s" in row:
            row["ratio_vs_transformers"] = row["decode_tokens_per_s"] / peer
    print(
        f"## Engine decode throughput: {params / 1e9:.2f}B-param random Llama, bf16, batch {BATCH}, "
        f"prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens\n"
    )
    print(
        "| system | decode tok/s | ratio vs transformers | t(1) s | t(N) s | error |\n|---|---|---|---|---|---|"
    )
    for row in rows:
        print(
            f"| {row['system']} | {row.get('decode_tokens_per_s', 0):.0f} | {row.get('ratio_vs_transformers', 0):.2f} "
            f"| {row.get('t_1_s', 0):.3f} | {row.get('t_n_s', 0):.3f} | {row.get('error', '')} |"
        )
    out = args.out or Path(os.environ.get("OUT") or "artifacts") / "gpu_engine.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "device": torch.cuda.get_device_name(),
                "params": params,
                "batch": BATCH,
                "prompt_len": PROMPT_LEN,
                "new_tokens": NEW_TOKENS,
                "rows": rows,
            },
            indent=2,
        )
    )
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
