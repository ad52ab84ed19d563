"""The sampler's CPU cost, alone and inside the engine, alternating this checkout with another one.

    .venv/bin/python -m experiments.sampler_ab --rounds 6 --against /tmp/sampler-base

Each round runs every checkout in turn (order reversed every other round) in a subprocess of its own whose
`engine` package is that checkout's (experiments/alternate.py). What a round measures:

* `sample_<mix>_<vocab>`: CPU µs of one `Sampler.sample` call on a [64, vocab] float32 batch of logits, for
  vocabularies of 262 (the built-in byte model) and 32,000 (a Llama's), and four mixes of rows: `greedy`;
  `sampled` (temperature 0.8, top-k 50, top-p 0.95); `seeded` (the same, each row its own seed); `mixed`
  (half greedy, a quarter sampled, a quarter seeded with a logit bias);
* `engine_<mix>`: output tokens per CPU second (process time, one torch thread: other load on the machine
  stretches wall time far more) of `engine.LLM.generate` on the random-weight benchmark model of
  bench/small_models.py, 64 requests of 16-48 prompt tokens and `--tokens` output tokens, greedy or
  `sampled`, best of two runs.

The report is the median of the rounds per checkout and the ratio this/other of each round.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

MIXES = ("greedy", "sampled", "seeded", "mixed")
VOCABS = (262, 32_000)
BATCH = 64


def _params(mix: str, row: int) -> dict[str, Any]:
    sampled = {"temperature": 0.8, "top_k": 50, "top_p": 0.95}
    if mix == "greedy" or (mix == "mixed" and row % 2 == 0):
        return {"temperature": 0.0}
    if mix == "sampled" or (mix == "mixed" and row % 4 == 1):
        return sampled
    extra = {"logit_bias": {5: 2.0, 9: -3.0}} if mix == "mixed" else {}
    return sampled | {"seed": row} | extra


def sampler_cost(mix: str, vocab: int, calls: int) -> float:
    """CPU µs per `Sampler.sample` call."""
    from engine.core.request import Request, RequestMeta
    from engine.core.sampling_params import SamplingParams
    from engine.worker.sampler import Sampler

    sampler = Sampler(0)
    requests = [Request(f"r{i}", [1], SamplingParams(**_params(mix, i)), RequestMeta()) for i in range(BATCH)]
    logits = torch.randn(BATCH, vocab, generator=torch.Generator().manual_seed(vocab))
    for _ in range(3):
        sampler.sample(logits, requests)
    start = time.process_time()
    for _ in range(calls):
        sampler.sample(logits, requests)
    return (time.process_time() - start) / calls * 1e6


def engine_rate(model_dir: Path, mix: str, tokens: int) -> float:
    """Output tokens per CPU second of LLM.generate on 64 requests of `tokens` tokens, best of two."""
    from engine import LLM, SamplingParams

    rng = random.Random(0)
    prompts = [[rng.randrange(256) for _ in range(rng.randint(16, 48))] for _ in range(BATCH)]
    llm = LLM(str(model_dir), max_num_seqs=BATCH, enable_prefix_caching=False)
    params = [
        SamplingParams(
            max_tokens=tokens, ignore_eos=True, **_params("greedy" if mix == "greedy" else "sampled", i)
        )
        for i in range(BATCH)
    ]
    llm.generate(prompts[:4], params[:4])  # warm-up
    best = 0.0
    for _ in range(2):
        start = time.process_time()
        produced = sum(len(o.token_ids) for o in llm.generate(prompts, params))
        best = max(best, produced / (time.process_time() - start))
    return best


def one(args: argparse.Namespace) -> dict[str, float]:
    """One checkout's sample."""
    from bench.small_models import write_small_model

    torch.set_num_threads(1)
    out = {
        f"sample_{mix}_{vocab}": sampler_cost(mix, vocab, args.calls if vocab < 1000 else args.calls // 10)
        for vocab in ([] if args.skip_sampler else VOCABS)
        for mix in MIXES
    }
    with tempfile.TemporaryDirectory() as tmp:
        write_small_model(Path(tmp))
        for mix in ("greedy", "sampled"):
            out[f"engine_{mix}"] = engine_rate(Path(tmp), mix, args.tokens)
    return out


def main() -> None:
    """CLI entry point: alternate the checkouts for `--rounds` rounds, print medians and ratios as JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--calls", type=int, default=400, help="sampler calls per measurement (a tenth at 32k)")
    p.add_argument("--tokens", type=int, default=64, help="output tokens per engine request")
    p.add_argument("--skip-sampler", action="store_true", help="only the engine figures")
    p.add_argument("--against", default=None, help="another checkout, measured in the same rounds")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    # Here, not at the top: a measurement (`--one`) runs with the other checkout first on the path.
    from experiments.alternate import alternate

    flags = [
        "--calls",
        str(args.calls),
        "--tokens",
        str(args.tokens),
        *(["--skip-sampler"] * args.skip_sampler),
    ]
    samples = alternate(__file__, flags, args.rounds, args.against)
    report: dict[str, Any] = {
        name: {k: round(statistics.median(s[k] for s in rounds), 2) for k in rounds[0]}
        for name, rounds in samples.items()
    }
    if args.against:
        report["this/other by round"] = {
            k: [round(a[k] / b[k], 3) for a, b in zip(samples["this"], samples["other"], strict=True)]
            for k in samples["this"][0]
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
