"""How `transformers serve`'s throughput grows with the streams it runs at once: the price of a fair window.

In front of an engine that serves requests, not tenants, a tenant holding at most d of the W requests in
flight gets at most d/W of a continuous batch's tokens, so its weighted share w/Σw needs W ≤ d·Σw/w
(docs/fairness.md, "In front of an upstream engine"). `python -m bench.upstream` runs A's 12 streams at
weight 4 beside B's 24 at weight 1: 4:1 needs W ≤ 15, while the engine alone runs all 36. This measures
the engine alone at each concurrency, alternated round by round in one run, so the throughput goal (≥ 0.95×
the engine alone) can be read against what a window of 8 (the unmetered default) or 15 can give.

    .venv/bin/python -m experiments.upstream_streams --streams 8,15,36 --rounds 3 --seconds 30
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys

from bench import upstream_report as rep
from bench.transformers_peer import transformers_serve
from bench.upstream import Front, Shape, run_phase


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m experiments.upstream_streams", description=__doc__)
    p.add_argument("--streams", default="8,15,36", help="closed-loop streams at once, comma-separated")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=30.0, help="each measured phase")
    p.add_argument("--warmup", type=float, default=5.0, help="seconds of each phase not counted")
    a = p.parse_args(argv)
    counts = [int(x) for x in a.streams.split(",")]
    shape = Shape(0, 0, 24, 32, 0.0, a.seconds, a.warmup)  # bench.upstream's prompts and outputs
    runs: dict[int, list[float]] = {n: [] for n in counts}
    with transformers_serve() as peer:
        front = Front(peer.url, peer.model, {}, None, "transformers serve --continuous-batching", False)
        asyncio.run(run_phase(front, shape, {"A": 2}, 2.0, 0))  # its first requests warm it
        for r in range(a.rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                phase = asyncio.run(run_phase(front, shape, {"A": n}, a.seconds, 10 * r + n))
                start = phase["A"].started + a.warmup
                runs[n].append(rep.throughput(phase.values(), start, phase["A"].started + a.seconds))
                print(f"round {r}: {n} streams {runs[n][-1]:.0f} tokens/s", flush=True)
    top = max(counts)
    medians = {n: statistics.median(v) for n, v in runs.items()}
    report = {
        "tokens_per_s": runs,
        "median": medians,
        f"over_{top}_streams": {n: medians[n] / medians[top] for n in counts},
    }
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
