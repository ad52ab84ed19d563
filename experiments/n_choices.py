"""n > 1: the fork inside the core against a fan-out above it (issue 55, point 5), on the embedded model.

    python -m experiments.n_choices                      # 8 prompts of 512 tokens, n = 3, 3 alternated rounds
    python -m experiments.n_choices --json out.json

- **fork** (what the engine does): one request of `n` choices. Its prompt is prefilled once and the choices
  fork from the leader's row once it has its first token (engine/core/family.py).
- **fan-out** (vLLM V1's `parallel_sampling.py` design, emulated without writing it): `n` requests of one
  choice each, the same prompt, handed to the core together with prefix caching on, which is what a fan-out
  above the core would hand it. The prompt is shared only where its blocks were computed before a sibling
  was scheduled.

Per design and round: the prompt tokens the engine computed (the iteration traces' `prefill_tokens`), the
time from submission to each choice's first token (median and slowest), and the wall time to the end.
Greedy choices with EOS ignored, so both designs produce the same tokens. Results: docs/engine.md, "n > 1".
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

from engine import EngineConfig, LLMEngine, SamplingParams
from engine.worker.loader import load_model


def _run(
    engine: LLMEngine, prompts: list[list[int]], n: int, max_tokens: int, fan_out: bool
) -> dict[str, Any]:
    """Submit every prompt at once (as n requests each, or one of n choices), step to the end."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    for i, prompt in enumerate(prompts):
        if fan_out:
            for c in range(n):
                engine.add_request(f"p{i}c{c}", prompt, params)
        else:
            engine.add_request(f"p{i}", prompt, replace(params, n=n))
    first: dict[tuple[str, int], float] = {}
    prefill = 0
    seen_iteration = engine.traces[-1].iteration if engine.traces else -1
    while engine.has_unfinished():
        for out in engine.step():
            key = (out.request_id, out.index)
            if out.new_token_ids and key not in first:
                first[key] = time.perf_counter() - start
        trace = engine.traces[-1]
        if trace.iteration != seen_iteration:
            prefill += trace.prefill_tokens
            seen_iteration = trace.iteration
    wall = time.perf_counter() - start
    ttft = sorted(first.values())
    assert len(ttft) == n * len(prompts), f"{len(ttft)} choices started, want {n * len(prompts)}"
    return {
        "prefill_tokens": prefill,
        "ttft_median_s": statistics.median(ttft),
        "ttft_max_s": ttft[-1],
        "wall_s": wall,
    }


def _median(rows: list[dict[str, Any]], key: str) -> float:
    return float(statistics.median(r[key] for r in rows))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--n", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    loaded = load_model(None, dtype="auto", device="cpu")
    config = EngineConfig(enable_prefix_caching=True, max_model_len=args.prompt_len + args.max_tokens + 16)
    # Distinct prompts (nothing shared across prompts), each new in every round and design.
    vocab = loaded.config.vocab_size
    rows: list[dict[str, Any]] = []
    for round_ in range(args.rounds):
        for design in ("fork", "fan-out") if round_ % 2 == 0 else ("fan-out", "fork"):
            engine = LLMEngine(config, loaded=loaded)  # a fresh cache: no prompt is cached from before
            base = 1000 * round_ + (0 if design == "fork" else 500)
            prompts = [
                [(base + 31 * i + 7 * t) % (vocab - 2) + 1 for t in range(args.prompt_len)]
                for i in range(args.prompts)
            ]
            row = _run(engine, prompts, args.n, args.max_tokens, design == "fan-out")
            rows.append({"round": round_, "design": design, **row})
            print(json.dumps(rows[-1]))
    print()
    print("| design | prompt tokens computed | first token, median / slowest (s) | wall (s) |")
    print("|---|---:|---:|---:|")
    for design in ("fork", "fan-out"):
        mine = [r for r in rows if r["design"] == design]
        print(
            f"| {design} | {_median(mine, 'prefill_tokens'):.0f} | {_median(mine, 'ttft_median_s'):.3f} / "
            f"{_median(mine, 'ttft_max_s'):.3f} | {_median(mine, 'wall_s'):.3f} |"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
