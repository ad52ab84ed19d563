"""CPU per finished request of the gateway's per-request metrics, and per scrape, alternating this checkout
with another one.

    .venv/bin/python -m experiments.metrics_cost --rounds 4 --against /work/main

Each round runs every checkout in turn (order reversed every other round) in a subprocess of its own, whose
`gateway` package is that checkout's (PYTHONPATH). What a round measures, as this thread's CPU time, in µs:

* `nonstream` / `stream`: one `GatewayMetrics.observe_finished` (what `_observe` in gateway/openai/submit.py
  calls as each run ends), with the RequestMetrics of a `max_tokens: 1` request and of a 16-token one (the
  latter observes the time per output token too);
* `scrape`: one `generate_latest` of the registry, with `--tenants` tenant labels that each finished requests.

The report is the median of the rounds per checkout and the ratio this/other of each round.

    .venv/bin/python -m experiments.metrics_cost --exposition --against /work/main

instead feeds both checkouts the same fixed series of 3,000 finished requests (random but seeded: latencies
on and off the buckets' bounds, tenants past the label limit, requests without engine metrics) and compares
their expositions, `_created` values masked, in the text format and in OpenMetrics: "identical", or a diff.
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

PARTS = ("nonstream", "stream", "scrape")


def one(args: argparse.Namespace) -> dict[str, float]:
    """One checkout's measurements (run in a subprocess whose PYTHONPATH is that checkout)."""
    from prometheus_client import generate_latest

    from engine import RequestMetrics
    from gateway.ops.metrics import GatewayMetrics, TenantLabels

    labels = TenantLabels(limit=args.tenants)
    labels.configure((f"t{i}", f"tenant{i}") for i in range(args.tenants))
    metrics = GatewayMetrics(labels)
    out: dict[str, float] = {}
    for part, tokens in (("nonstream", 1), ("stream", 16)):
        m = RequestMetrics(
            12, 0, tokens, 20.0, 0, 0, 0, None, 100.0, 100.001, 100.004, 100.004 + 0.003 * tokens
        )
        tenant_ids = [f"t{i % args.tenants}" for i in range(args.requests)]
        start = time.thread_time()
        for tenant_id in tenant_ids:
            metrics.observe_finished(tenant_id, "completed", m)
        out[part] = (time.thread_time() - start) / args.requests * 1e6
    start = time.thread_time()
    for _ in range(args.scrapes):
        generate_latest(metrics.registry)
    out["scrape"] = (time.thread_time() - start) / args.scrapes * 1e6
    return out


def exposition(openmetrics: bool) -> str:
    """The exposition of a fixed series of finished requests, `_created` values masked (run per checkout)."""
    from prometheus_client import generate_latest
    from prometheus_client.openmetrics import exposition as om

    from engine import EngineStats, RequestMetrics
    from gateway.ops.metrics import GatewayMetrics, TenantLabels

    labels = TenantLabels(limit=3)
    labels.configure(
        [("t1", "acme"), ("t2", "beta"), ("t5", "gamma")]
    )  # gamma: only requests without metrics
    metrics = GatewayMetrics(labels, lambda: EngineStats(kv_blocks_used=1, kv_blocks_total=8))
    rng = random.Random(7)
    bounds = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0]

    def span() -> float:
        return (
            rng.choice(bounds) if rng.random() < 0.2 else rng.expovariate(1 / rng.choice([0.01, 0.3, 5, 200]))
        )

    for _ in range(3000):
        tenant = rng.choice(["t1", "t2", "t3", "t4"])
        status = rng.choice(["completed", "completed", "cancelled", "failed", "rejected"])
        if rng.random() < 0.15:
            metrics.count_request("t5" if rng.random() < 0.5 else tenant, status)
            continue
        arrival = 1000.0 + rng.random()
        scheduled = arrival + span() if rng.random() < 0.95 else None
        first = arrival + span() if rng.random() < 0.9 else None
        finished = first + span() if first is not None and rng.random() < 0.9 else None
        m = RequestMetrics(
            *(rng.randint(0, 500), rng.randint(0, 50), rng.randint(0, 40), rng.uniform(-5, 100), 0, 0),
            *(rng.randint(0, 3), None, arrival, scheduled, first, finished),
        )
        metrics.observe_finished(tenant, status, m)
    text = (om.generate_latest if openmetrics else generate_latest)(metrics.registry).decode()
    return re.sub(r"(_created(\{[^}]*\})?) \S+", r"\1 T", text)


def same_exposition(checkouts: dict[str, Path]) -> None:
    """Compare the checkouts' expositions of the fixed series: print "identical" or the diff."""
    for flag in ("--text", "--openmetrics"):
        texts = []
        for path in checkouts.values():
            env = {**os.environ, "PYTHONPATH": str(path)}
            cmd = [sys.executable, str(Path(__file__).resolve()), flag]
            texts.append(
                subprocess.run(cmd, env=env, cwd=path, capture_output=True, text=True, check=True).stdout
            )
        diff = list(difflib.unified_diff(texts[0].splitlines(), texts[-1].splitlines(), lineterm=""))
        lines = texts[0].count("\n")
        print(f"{flag[2:]}: {lines} lines,", "identical" if not diff else "differ:\n" + "\n".join(diff))


def main() -> None:
    """CLI entry point: alternate the checkouts for `--rounds` rounds, print medians and ratios as JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=200_000, help="observe_finished calls per measurement")
    p.add_argument("--tenants", type=int, default=50, help="tenant labels (the default --metrics-tenants)")
    p.add_argument("--scrapes", type=int, default=200)
    p.add_argument("--against", default=None, help="another checkout, measured in the same rounds")
    p.add_argument("--exposition", action="store_true", help="compare the checkouts' expositions instead")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--text", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--openmetrics", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.one:
        print(json.dumps(one(args)))
        return
    if args.text or args.openmetrics:
        sys.stdout.write(exposition(args.openmetrics))
        return
    # Here, not at the top: a measurement (`--one`) runs with the other checkout first on the path, which
    # may not have this module.
    from experiments.alternate import alternate, checkouts

    if args.exposition:
        same_exposition(checkouts(args.against))
        return
    flags = ["--requests", str(args.requests), "--tenants", str(args.tenants), "--scrapes", str(args.scrapes)]
    samples = alternate(__file__, flags, args.rounds, args.against)
    report: dict[str, Any] = {
        name: {k: round(statistics.median(s[k] for s in rounds), 2) for k in PARTS}
        for name, rounds in samples.items()
    }
    if args.against:
        report["this/other by round"] = {
            k: [round(a[k] / b[k], 3) for a, b in zip(samples["this"], samples["other"], strict=True)]
            for k in PARTS
        }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
