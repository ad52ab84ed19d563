"""1 prefill + 1 decode engine against 2 co-located engines on the retrieval workload, in one run.

    .venv/bin/python -m experiments.disagg_bench [--rate 4] [--duration 8] [--rounds 2]

Starts four real `fairserve engine` processes on this host (a `--role prefill` and a `--role decode`
engine behind a DisaggRouter; two `--role both` engines behind an EngineRouter) and sends the same open-loop
retrieval plan (bench/workloads.py: 320-480-token prompts, 75% behind a shared 256-token prefix, 4-12
output tokens, greedy) to each pair in turn, alternating ABBA... for `--rounds` rounds each; only the arm
being measured is busy. Per arm: p50/p99 TPOT ((last token - first token) / (tokens - 1)), p50 TTFT,
output tokens per second over the arm's makespan, and, for the disaggregated arm, the decode engine's
KV pulls (ask to last frame, engine/serving/remote/kv_transfer.py) per request. Ratios are disaggregated /
co-located over all rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench.workloads import WORKLOADS, plan
from engine import RequestMeta, SamplingParams
from engine.serving.boundary.client import EngineClient
from engine.serving.remote.liveness import SilenceBounds
from engine.serving.remote.roles import RoleAwareEngine
from routing import EngineRouter
from routing.roles import DisaggRouter
from tests.engine.serving.remote.engine_process import EngineProcess

ENGINE_ARGS = ("--num-kv-blocks", "1024", "--max-num-batched-tokens", "512")


async def one(
    engine: EngineClient, at: float, prompt: list[int], max_tokens: int, rid: str, tenant: str
) -> dict[str, float]:
    """Send one request at its planned offset; its TTFT, TPOT and tokens."""
    await asyncio.sleep(max(0.0, at - time.monotonic()))
    sent = time.monotonic()
    first = last = sent
    n = 0
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    async for out in engine.generate(prompt, params, RequestMeta(tenant_id=tenant), rid):
        last = time.monotonic()
        if n == 0 and out.new_token_ids:
            first = last
        n += len(out.new_token_ids)
    return {
        "ttft": first - sent,
        "tpot": (last - first) / (n - 1) if n > 1 else float("nan"),
        "tokens": n,
        "end": last,
    }


async def arm(engine: EngineClient, rate: float, duration: float, tag: str) -> dict[str, float]:
    """One round: the retrieval plan through `engine`; summary figures."""
    planned = plan(WORKLOADS["retrieval"], rate, duration, seed=0)
    t0 = time.monotonic() + 0.2
    jobs = [
        one(engine, t0 + p.at, engine.tokenizer.encode(p.prompt), p.max_tokens[0], f"{tag}-{i}", p.tenant)
        for i, p in enumerate(planned)
    ]
    done = await asyncio.gather(*jobs)
    tpots = sorted(d["tpot"] for d in done if d["tpot"] == d["tpot"])
    makespan = max(d["end"] for d in done) - t0
    return {
        "tpot_p50": statistics.median(tpots),
        "tpot_p99": tpots[int(0.99 * (len(tpots) - 1))],
        "ttft_p50": statistics.median(d["ttft"] for d in done),
        "tokens_per_s": sum(d["tokens"] for d in done) / makespan,
        "requests": len(done),
    }


def pools(procs: Sequence[EngineProcess]) -> tuple[DisaggRouter, EngineRouter, RoleAwareEngine]:
    clients = [RoleAwareEngine(p.address, SilenceBounds(2.0, 5.0)) for p in procs]
    for c in clients:
        c.start()
    prefill, decode, a, b = clients
    disagg = DisaggRouter({"prefill": prefill}, {"decode": decode})
    return disagg, EngineRouter({"a": a, "b": b}), decode


async def measure(procs: Sequence[EngineProcess], rate: float, duration: float, rounds: int) -> None:
    disagg, coloc, decode = pools(procs)
    results: dict[str, list[dict[str, float]]] = {"disagg": [], "coloc": []}
    transfers = 0
    transfer_s = 0.0
    try:
        await arm(disagg, rate, 1.0, "warm-d")
        await arm(coloc, rate, 1.0, "warm-c")
        order = [("disagg", "coloc"), ("coloc", "disagg")]
        for r in range(rounds):
            for name in order[r % 2]:
                before = decode.stats()
                res = await arm(disagg if name == "disagg" else coloc, rate, duration, f"{name}-{r}")
                if name == "disagg":
                    after = decode.stats()
                    transfers += after.kv_transfers - before.kv_transfers
                    transfer_s += after.kv_transfer_s - before.kv_transfer_s
                results[name].append(res)
                print(name, r, {k: round(v, 4) for k, v in res.items()}, flush=True)
    finally:
        disagg.shutdown(1.0)
        coloc.shutdown(1.0)
    med = {n: {k: statistics.median(x[k] for x in rs) for k in rs[0]} for n, rs in results.items()}
    d, c = med["disagg"], med["coloc"]
    print(f"\nmedian over {rounds} rounds each, rate {rate}/s, {duration} s per round")
    print("| | 1 prefill + 1 decode | 2 co-located | disaggregated / co-located |")
    print("|---|---:|---:|---:|")
    for key, unit, scale in (
        ("tpot_p99", "ms", 1e3),
        ("tpot_p50", "ms", 1e3),
        ("ttft_p50", "ms", 1e3),
        ("tokens_per_s", "tok/s", 1),
    ):
        print(f"| {key} ({unit}) | {d[key] * scale:.1f} | {c[key] * scale:.1f} | **{d[key] / c[key]:.2f}** |")
    print(f"KV transfer per request: {transfer_s / max(transfers, 1) * 1e3:.2f} ms over {transfers} pulls")


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=4.0, help="arrivals per second")
    parser.add_argument("--duration", type=float, default=8.0, help="seconds of arrivals per round")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per arm, alternating")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fairserve-disagg-") as tmp:
        roles = ("prefill", "decode", "both", "both")
        procs = [EngineProcess(Path(tmp) / f"e{i}", *ENGINE_ARGS, "--role", r) for i, r in enumerate(roles)]
        try:
            asyncio.run(measure(procs, args.rate, args.duration, args.rounds))
        finally:
            for p in procs:
                p.stop()


if __name__ == "__main__":
    main()
