"""Shared system prompt across 64 tenants: isolated, public prefix, one cache group, same run.

    .venv/bin/python -m bench.shared_prefix [--rounds 2] [--requests 2] [--probes 24]

One CPU engine (the embedded model, context 2,048) behind the gateway, over HTTP. 64 tenants each send
`--requests` requests: a system prompt of `--system` tokens plus a private suffix, 4 output tokens, 16 in
flight, under three settings, each with a fresh system prompt, alternating in every round: `isolated`
(every tenant keys its own blocks), `public` (the system prompt is a public prefix) and `group` (all
tenants in one cache group). Throughput is requests/s over the batch. The distinguisher: a victim sends
the prompt plus a secret suffix (or nothing), then another tenant times the same prompt (max_tokens 1);
AUC is the chance that a probe after a victim's request is faster than one without (0.5: no signal).
The KV cache (`--kv-blocks`) holds a few copies of the system prompt, not 64.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from typing import Any

import httpx

from bench.harness import parser, table, text
from bench.server import LocalServer, local_gateway

TENANTS = [f"t{i:02d}" for i in range(64)]
SETTINGS = ("isolated", "public", "group")
CONCURRENCY = 16


async def _admin(server: LocalServer, client: httpx.AsyncClient, setting: str, system: str) -> None:
    """Put the server in `setting` for `system`: tenants' cache groups and the public registry."""
    admin = server.admin()
    for name in TENANTS:
        group = {"cache_group": "bench-all" if setting == "group" else None}
        (await client.patch(f"/admin/api/tenants/{name}", json=group, headers=admin)).raise_for_status()
    for p in (await client.get("/admin/api/prefixes", headers=admin)).json()["prefixes"]:
        (await client.delete(f"/admin/api/prefixes/{p['id']}", headers=admin)).raise_for_status()
    if setting == "public":
        body = {"model": server.model, "name": "system", "text": system}
        (await client.post("/admin/api/prefixes", json=body, headers=admin)).raise_for_status()


async def _complete(
    server: LocalServer, client: httpx.AsyncClient, tenant: str, prompt: str, max_tokens: int
) -> tuple[float, dict[str, Any]]:
    """(seconds at the client, usage) of one completion."""
    sent = time.perf_counter()
    resp = await server.complete(client, tenant, prompt=prompt, max_tokens=max_tokens, ignore_eos=True)
    seconds = time.perf_counter() - sent
    resp.raise_for_status()
    return seconds, json.loads(resp.content)["usage"]


async def _throughput(
    server: LocalServer, client: httpx.AsyncClient, system: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, float]:
    jobs = [(t, system + text(args.suffix, rng)) for t in TENANTS for _ in range(args.requests)]
    rng.shuffle(jobs)
    cached = {"public_cached": 0, "private_cached": 0}

    async def worker() -> None:
        while jobs:
            _, usage = await _complete(server, client, *jobs.pop(), 4)
            for kind in cached:
                cached[kind] += usage["prompt_tokens_details"][f"{kind}_tokens"]

    n, start = len(jobs), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    return {"requests_per_s": n / (time.perf_counter() - start), **cached}


def auc(positives: list[float], negatives: list[float]) -> float:
    """P(a positive probe is faster than a negative one), ties counting half: 0.5 means no signal."""
    wins = sum((p < q) + 0.5 * (p == q) for p in positives for q in negatives)
    return wins / (len(positives) * len(negatives))


async def _distinguisher(
    server: LocalServer, client: httpx.AsyncClient, system: str, args: argparse.Namespace, rng: random.Random
) -> float:
    latencies: dict[bool, list[float]] = {True: [], False: []}
    for i in range(args.probes):
        victim, attacker = rng.sample(TENANTS, 2)
        prompt = system + text(args.suffix, rng)
        if i % 2 == 0:
            await _complete(server, client, victim, prompt, 1)
        latencies[i % 2 == 0].append((await _complete(server, client, attacker, prompt, 1))[0])
    return auc(latencies[True], latencies[False])


async def _round(server: LocalServer, args: argparse.Namespace, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=600.0) as client:
        for setting in SETTINGS:
            system = text(args.system, rng)
            await _admin(server, client, setting, system)
            out[setting] = await _throughput(server, client, system, args, rng)
            out[setting]["auc"] = await _distinguisher(server, client, system, args, rng)
    return out


def main(argv: list[str] | None = None) -> None:
    args = parser(
        __doc__,
        rounds=2,
        requests=(2, "requests per tenant per setting"),
        system=(1792, "system prompt tokens (context is 2,048)"),
        suffix=(192, "private suffix tokens"),
        probes=(24, "distinguisher probes per setting"),
        kv_blocks=1024,
    ).parse_args(argv)
    engine = {"max_num_seqs": CONCURRENCY, "max_num_batched_tokens": 1024, "num_kv_blocks": args.kv_blocks}
    with local_gateway(TENANTS, **engine) as server:
        rounds = [asyncio.run(_round(server, args, seed)) for seed in range(args.rounds)]
    for r, result in enumerate(rounds, start=1):
        print(
            f"round {r}:", json.dumps({k: {m: round(v, 3) for m, v in d.items()} for k, d in result.items()})
        )
        ratio = result["public"]["requests_per_s"] / result["group"]["requests_per_s"]
        print(f"round {r}: public / group throughput {ratio:.3f}")
    rows = []
    for s in SETTINGS:
        med = {m: statistics.median(r[s][m] for r in rounds) for m in rounds[0][s]}
        rows.append(
            f"{s} | {med['requests_per_s']:.2f} | {med['public_cached']:.0f} | {med['private_cached']:.0f} "
            f"| {med['auc']:.2f}"
        )
    header = "setting | requests/s (median) | public cached | private cached | distinguisher AUC (median)"
    print("\n".join(table(header, "lllll", rows)))


if __name__ == "__main__":
    main()
