"""What routing adds per request on the gateway's event loop: the ranking and the aggregated stats.

    .venv/bin/python -m experiments.routing_cost

A router over N idle in-process engines on the embedded model: `_ranked` (health, stats, prefix digests
and the score for every engine: once per submit) and `stats()` (admission reads it twice per request),
against one engine's own `stats()`. Best of five repeats, microseconds per call.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from functools import partial

from engine import AsyncEngine, EngineConfig, LLMEngine, RequestMeta
from engine.worker.loader import load_model
from routing import EngineRouter


def per_call_us(fn: Callable[[], object], number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", type=int, nargs="+", default=[1, 2, 8])
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--number", type=int, default=2000)
    args = parser.parse_args()
    loaded = load_model(None, dtype="auto", device="cpu")
    cfg = EngineConfig(max_num_seqs=4, num_kv_blocks=128)
    prompt = list(range(1, args.prompt_tokens + 1))
    meta = RequestMeta(tenant_id="a")
    print("| engines | ranking (us) | router stats() (us) | one engine's stats() (us) |\n|---|---|---|---|")
    for n in args.engines:
        engines = {f"e{i}": AsyncEngine(cfg, engine=LLMEngine(cfg, loaded=loaded)) for i in range(n)}
        router = EngineRouter(engines)
        router.start()
        try:
            rank = per_call_us(partial(router._ranked, prompt, meta), args.number)
            stats = per_call_us(router.stats, args.number)
            one = per_call_us(engines["e0"].stats, args.number)
        finally:
            router.shutdown()
        print(f"| {n} | {rank:.1f} | {stats:.1f} | {one:.1f} |")


if __name__ == "__main__":
    main()
