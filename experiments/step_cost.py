"""Measure the step cost model's coefficients on this machine (engine/core/step_cost.py, docs/engine.md).

Times real engine steps (the embedded model unless --model) of four shapes, each the median of --repeats:

- one fresh prompt of 128 and of 512 tokens: the time of a new token, `a`;
- 32 fresh prompts of 16 tokens (512 tokens): the extra of 31 sequences, so `sequence = c / a`;
- 32 prompts of 16 new tokens after the same cached 2,000-token prefix: the extra of attending over
  32 × 16 × 2,000 cached positions, so `context = b / a`.

It prints the two coefficients and the flags that set them, and the device factor (context over the model's
FLOP ratio) to write into engine/config.py's table for this device kind:

    .venv/bin/python -m experiments.step_cost [--device cuda] [--repeats 5]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from collections.abc import Sequence

from engine.config import EngineConfig
from engine.core.request import RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.serving.llm_engine import LLMEngine
from engine.worker.lora.cost import attention_flop_ratio

_PREFIX = 2000


def _step_seconds(engine: LLMEngine, prompts: Sequence[list[int]], tag: str) -> float:
    """Queue `prompts` (max_tokens 1) and time the one step that prefills them all."""
    for i, prompt in enumerate(prompts):
        engine.add_request(f"{tag}-{i}", prompt, SamplingParams(max_tokens=1), RequestMeta(tenant_id="t"))
    t0 = time.perf_counter()
    engine.step()
    seconds = time.perf_counter() - t0
    while engine.has_unfinished():
        engine.step()
    return seconds


def measure(device: str, repeats: int, model: str | None) -> dict[str, float]:
    """The coefficients, in new-token equivalents, from medians of timed steps."""
    config = EngineConfig(
        device=device,
        model=model,
        max_num_batched_tokens=4096,
        step_cost_context=0.0,
        step_cost_sequence=0.0,
    )
    engine = LLMEngine(config)
    rng = random.Random(0)

    def fresh(n: int) -> list[int]:
        return [rng.randrange(1, 250) for _ in range(n)]

    prefix = fresh(_PREFIX)
    _step_seconds(engine, [prefix + fresh(16)], "warm")  # caches the prefix; also warms the kernels
    shapes: dict[str, list[float]] = {"p128": [], "p512": [], "seq32": [], "ctx32": []}
    for r in range(repeats):
        shapes["p128"].append(_step_seconds(engine, [fresh(128)], f"a{r}"))
        shapes["p512"].append(_step_seconds(engine, [fresh(512)], f"b{r}"))
        shapes["seq32"].append(_step_seconds(engine, [fresh(16) for _ in range(32)], f"c{r}"))
        shapes["ctx32"].append(_step_seconds(engine, [prefix + fresh(16) for _ in range(32)], f"d{r}"))
    med = {k: statistics.median(v) for k, v in shapes.items()}
    per_token = (med["p512"] - med["p128"]) / 384
    per_sequence = max(0.0, (med["seq32"] - med["p512"]) / 31)
    per_position = max(0.0, (med["ctx32"] - med["seq32"]) / (32 * 16 * _PREFIX))
    context = per_position / per_token
    ratio = attention_flop_ratio(engine.loaded.config)
    return {
        **{f"{k}_ms": v * 1e3 for k, v in med.items()},
        "token_us": per_token * 1e6,
        "sequence": per_sequence / per_token,
        "context": context,
        "device_factor": context / ratio,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--model", default=None)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result = measure(args.device, args.repeats, args.model)
    print(json.dumps(result, indent=2))
    print(f"flags: --step-cost-context {result['context']:.3g} --step-cost-sequence {result['sequence']:.3g}")


if __name__ == "__main__":
    main()
