"""Engine throughput on CPU: fairserve `LLM.generate` against transformers `generate()` and `generate_batch()`.

    .venv/bin/python -m bench.engine_throughput --out artifacts/engine_throughput.json

One random-weight model loaded by every side from one directory, one workload of mixed lengths, greedy
with EOS ignored so every system produces exactly the requested tokens; the systems run in turn in this
process with the same torch threads, each after its own warm-up, best of `--repeats` interleaved rounds.
Prints a Markdown table; writes JSON to --out. Method and results: docs/engine.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import platform
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.harness import table
from bench.small_models import ARCHES, PAD_ID, write_small_model


@dataclass
class Workload:
    """Prompts (token ids) and the exact number of output tokens each must produce."""

    prompts: list[list[int]]
    max_tokens: list[int]


@dataclass
class Result:
    """One system's measurement on the workload."""

    system: str
    output_tokens: int
    seconds: float

    @property
    def tokens_per_s(self) -> float:
        return self.output_tokens / self.seconds


Runner = Callable[[Workload], int]  # serves a workload, returns the useful output tokens


def make_workload(
    num: int, prompt_range: tuple[int, int], output_range: tuple[int, int], seed: int
) -> Workload:
    """Log-uniform prompt and output lengths over the given ranges, random byte-token prompts."""
    rng = random.Random(seed)

    def log_uniform(lo: int, hi: int) -> int:
        return round(lo * math.pow(hi / lo, rng.random()))

    prompts = [[rng.randrange(32, 127) for _ in range(log_uniform(*prompt_range))] for _ in range(num)]
    outputs = [log_uniform(*output_range) for _ in range(num)]
    # Pin both extremes so the spread is what the workload promises, whatever the seed draws.
    prompts[0] = prompts[0][:1] * prompt_range[0]
    prompts[1] = [rng.randrange(32, 127) for _ in range(prompt_range[1])]
    outputs[0], outputs[1] = output_range[1], output_range[0]
    return Workload(prompts, outputs)


def fairserve_runner(
    model_dir: Path, max_num_seqs: int, max_num_batched_tokens: int, enforce_eager: bool
) -> Runner:
    """`engine.LLM` serving a workload (`enforce_eager`: without the padded decode-graph inputs)."""
    from engine import LLM, SamplingParams

    llm = LLM(
        str(model_dir),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        enable_prefix_caching=False,
        enforce_eager=enforce_eager,
    )

    def run(w: Workload) -> int:
        params = [SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True) for n in w.max_tokens]
        produced = [len(o.token_ids) for o in llm.generate(w.prompts, params)]
        if produced != w.max_tokens:
            raise RuntimeError("fairserve produced a different number of tokens than requested")
        return sum(produced)

    return run


def hf_static_runner(model: Any, batch_size: int) -> Runner:
    """Static left-padded `generate()` batches in arrival order."""

    def run(w: Workload) -> int:
        for lo in range(0, len(w.prompts), batch_size):
            prompts, steps = w.prompts[lo : lo + batch_size], max(w.max_tokens[lo : lo + batch_size])
            width = max(len(p) for p in prompts)
            ids = torch.tensor([[PAD_ID] * (width - len(p)) + p for p in prompts])
            mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
            with torch.inference_mode():
                out = model.generate(
                    input_ids=ids, attention_mask=mask, max_new_tokens=steps, min_new_tokens=steps
                )
            if out.shape[1] - width != steps:
                raise RuntimeError("generate() stopped early")
        return sum(w.max_tokens)  # tokens past a request's own max_new_tokens are waste, not output

    return run


def hf_continuous_runner(
    model: Any, num_blocks: int | None = None, max_batch_tokens: int | None = None
) -> Runner:
    """transformers' continuous-batching manager (generate_batch's engine).

    Left unset, `num_blocks` and `max_batch_tokens` are sized by transformers from free memory: on CPU
    that is most of the machine's RAM, so callers sharing a process (the product bench) bound them.
    """
    from transformers import GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=PAD_ID, max_new_tokens=1)
    bounds = None
    if num_blocks is not None or max_batch_tokens is not None:
        bounds = ContinuousBatchingConfig(num_blocks=num_blocks, max_batch_tokens=max_batch_tokens)

    def run(w: Workload) -> int:
        produced, deadline = 0, time.monotonic() + 3600
        with model.continuous_batching_context_manager(
            generation_config=config, block=True, timeout=30, continuous_batching_config=bounds
        ) as manager:
            pending = {
                manager.add_request(p, request_id=f"r{i}", max_new_tokens=n, eos_token_id=-1)
                for i, (p, n) in enumerate(zip(w.prompts, w.max_tokens, strict=True))
            }
            while pending and time.monotonic() < deadline:
                result = manager.get_result(timeout=1)
                if result is not None and result.is_finished():
                    pending.discard(result.request_id)
                    produced += len(result.generated_tokens)
                elif result is None and not manager.is_running():
                    raise RuntimeError("transformers' continuous batching loop died")
        if pending or produced != sum(w.max_tokens):
            raise RuntimeError(
                f"generate_batch: {len(pending)} unfinished, {produced} of {sum(w.max_tokens)} tokens"
            )
        return produced

    return run


def runners(
    model_dir: Path,
    systems: list[str],
    batch_size: int,
    engine_limits: tuple[int, int],
    hf_bounds: tuple[int | None, int | None] = (None, None),
) -> tuple[dict[str, Runner], int]:
    """The named systems' runners (fairserve, fairserve_eager, generate, generate_batch) and the model's
    parameter count.

    `engine_limits` is fairserve's (max_num_seqs, max_num_batched_tokens); `hf_bounds` generate_batch()'s
    (num_blocks, max_batch_tokens), None letting transformers size it from free memory.
    """
    from transformers import AutoModelForCausalLM

    runs: dict[str, Runner] = {}
    if "fairserve" in systems:
        runs["fairserve"] = fairserve_runner(model_dir, *engine_limits, False)
    if "fairserve_eager" in systems:  # docs/engine.md, "CUDA graphs": the padded decode path's cost on CPU
        runs["fairserve (enforce_eager)"] = fairserve_runner(model_dir, *engine_limits, True)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()  # EOS off, greedy
    hf.generation_config.update(eos_token_id=None, pad_token_id=PAD_ID, do_sample=False)
    if "generate" in systems:
        runs[f"transformers generate() (static, batch {batch_size})"] = hf_static_runner(hf, batch_size)
    if "generate_batch" in systems:
        blocks, tokens = hf_bounds
        bounds = f", {tokens} batch tokens, {blocks} blocks" if (blocks, tokens) != (None, None) else ""
        runs[f"transformers generate_batch() (continuous{bounds})"] = hf_continuous_runner(hf, blocks, tokens)
    return runs, sum(p.numel() for p in hf.parameters())


def measure(runs: dict[str, Runner], workload: Workload, warmup: Workload, repeats: int) -> list[Result]:
    """Warm every system up, then time `repeats` rounds, systems interleaved; keep each one's best round
    (robust ratios on a shared machine)."""
    for run in runs.values():
        run(warmup)
    best: dict[str, Result] = {}
    for _ in range(repeats):
        for system, run in runs.items():
            start = time.perf_counter()
            result = Result(system, run(workload), 0.0)
            result.seconds = time.perf_counter() - start
            best[system] = min(best.get(system, result), result, key=lambda r: r.seconds)
    return list(best.values())


def markdown(results: list[Result], header: str) -> str:
    """The results as a Markdown table, ratios of fairserve over each peer."""
    ours = next(r for r in results if r.system == "fairserve").tokens_per_s
    rows = (
        f"{r.system} | {r.output_tokens} | {r.seconds:.2f} | {r.tokens_per_s:.1f} | {ours / r.tokens_per_s:.2f}x"
        for r in results
    )
    head = "system | output tokens | seconds | output tok/s | fairserve speed-up"
    return "\n".join([header, "", *table(head, "lrrrr", rows)])


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    a = p.add_argument
    a(
        "--model",
        default="small",
        help="'default' (embedded tiny), 'small' (~25M random --arch) or a directory",
    )
    a("--arch", default="llama", choices=list(ARCHES), help="the architecture of --model small")
    a("--num-requests", type=int, default=64)
    a("--prompt-len", type=int, nargs=2, default=(8, 256), metavar=("MIN", "MAX"))
    a("--output-len", type=int, nargs=2, default=(8, 128), metavar=("MIN", "MAX"))
    a("--batch-size", type=int, default=16, help="static generate() batch size")
    a("--max-num-seqs", type=int, default=64)
    a("--max-num-batched-tokens", type=int, default=512)
    a("--threads", type=int, default=2, help="torch threads, the same for every system")
    a("--seed", type=int, default=0)
    a("--repeats", type=int, default=2, help="timed rounds per system; the best one counts")
    a("--systems", default="fairserve,generate,generate_batch")
    sized = "(default: transformers sizes it from free memory)"
    a("--hf-max-batch-tokens", type=int, help=f"bound generate_batch()'s token budget {sized}")
    a("--hf-num-blocks", type=int, help=f"bound generate_batch()'s KV cache blocks {sized}")
    a("--out", type=Path, default=Path("artifacts/engine_throughput.json"))
    args = p.parse_args(argv)
    if args.num_requests < 2 or args.prompt_len[0] < 1 or args.output_len[0] < 1 or args.repeats < 1:
        p.error("need >= 2 requests, lengths >= 1 and repeats >= 1")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the systems on one workload; print the table and write JSON."""
    args = _args(argv)
    torch.set_num_threads(args.threads)
    for name in ("transformers", "ContinuousBatchingLogger"):
        logging.getLogger(name).setLevel(logging.ERROR)
    workload = make_workload(args.num_requests, tuple(args.prompt_len), tuple(args.output_len), args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(args.model if args.model not in ("default", "small") else tmp)
        if args.model == "default":
            from engine.worker.loader import default_model_dir

            model_dir = default_model_dir()
        elif args.model == "small":
            write_small_model(model_dir, args.arch)
        limits = (args.max_num_seqs, args.max_num_batched_tokens)
        bounds = (args.hf_num_blocks, args.hf_max_batch_tokens)
        runs, params = runners(model_dir, args.systems.split(","), args.batch_size, limits, bounds)
        results = measure(runs, workload, make_workload(8, (4, 32), (2, 8), args.seed + 1), args.repeats)
    (p0, p1), (o0, o1) = args.prompt_len, args.output_len
    if any(r.system == "fairserve" for r in results):
        kind = args.arch if args.model == "small" else "model"
        header = (
            f"## Engine throughput, CPU ({args.threads} torch threads): {params / 1e6:.1f}M-param random "
        )
        header += f"{kind} ({args.model}), fp32, {args.num_requests} requests, prompts {p0}-{p1} tokens, "
        print(markdown(results, header + f"outputs {o0}-{o1} tokens, greedy, EOS ignored"))
    setup = ("num_requests", "prompt_len", "output_len", "batch_size", "repeats", "max_num_seqs")
    doc = {"model": args.model, "arch": args.arch, "params": params, "threads": args.threads}
    doc |= {"torch": torch.__version__, "machine": platform.processor() or platform.machine()}
    doc |= {k: getattr(args, k) for k in (*setup, "max_num_batched_tokens")}
    doc["results"] = [asdict(r) | {"tokens_per_s": r.tokens_per_s} for r in results]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"\nwrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
