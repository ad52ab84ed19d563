"""Shared system prompt across 64 tenants (issue 33): isolated, public prefix, one cache group, same run.

    .venv/bin/python -m bench.shared_prefix [--rounds 2] [--requests 2] [--probes 24]

One CPU engine (the embedded default model, context 2,048 tokens) behind the real gateway, over real
HTTP. 64 tenants each send `--requests` requests: one system prompt of `--system` tokens (byte-level:
a character is a token) plus a private suffix, 4 output tokens, 16 in flight. Three settings, each with
a fresh system prompt so none starts warm, alternating in every round:

  isolated  today's default: every tenant keys its own blocks
  public    the system prompt registered as a public prefix (POST /admin/api/prefixes)
  group     all 64 tenants in one cache group: no isolation at all

Throughput is requests per second over the whole batch. The distinguisher: a victim tenant sends the
system prompt plus a secret suffix (or sends nothing), then another tenant times the same prompt
(max_tokens 1, measured at the client); AUC is the chance that a probe after a victim's request is
faster than one without (0.5: the attacker learns nothing). The KV cache (`--kv-blocks`) holds a few
copies of the system prompt, not 64: the memory pressure under which isolation re-prefills.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import string
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench.server import LocalServer, start_local_server
from engine import EngineConfig

TENANTS = [f"t{i:02d}" for i in range(64)]
SETTINGS = ("isolated", "public", "group")
CONCURRENCY = 16


def _text(n: int, rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(n))


async def _admin(server: LocalServer, client: httpx.AsyncClient, setting: str, system: str) -> None:
    """Put the server in `setting` for `system`: tenants' cache groups and the public registry."""
    admin = {"Authorization": f"Bearer {server.state.admin_token}"}
    group = "bench-all" if setting == "group" else None
    for name in TENANTS:
        resp = await client.patch(f"/admin/api/tenants/{name}", json={"cache_group": group}, headers=admin)
        resp.raise_for_status()
    for p in (await client.get("/admin/api/prefixes", headers=admin)).json()["prefixes"]:
        (await client.delete(f"/admin/api/prefixes/{p['id']}", headers=admin)).raise_for_status()
    if setting == "public":
        body = {"model": server.model, "name": "system", "text": system}
        (await client.post("/admin/api/prefixes", json=body, headers=admin)).raise_for_status()


async def _complete(
    server: LocalServer, client: httpx.AsyncClient, tenant: str, prompt: str, max_tokens: int
) -> tuple[float, dict[str, Any]]:
    """(seconds at the client, usage) of one completion."""
    body = {"model": server.model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True}
    sent = time.perf_counter()
    resp = await client.post(
        "/v1/completions", json=body, headers={"Authorization": f"Bearer {server.keys[tenant]}"}
    )
    seconds = time.perf_counter() - sent
    resp.raise_for_status()
    return seconds, json.loads(resp.content)["usage"]


async def _throughput(
    server: LocalServer, client: httpx.AsyncClient, system: str, args: argparse.Namespace, rng: random.Random
) -> dict[str, float]:
    jobs = [(t, system + _text(args.suffix, rng)) for t in TENANTS for _ in range(args.requests)]
    rng.shuffle(jobs)
    public = private = 0

    async def worker() -> None:
        nonlocal public, private
        while jobs:
            tenant, prompt = jobs.pop()
            _, usage = await _complete(server, client, tenant, prompt, 4)
            public += usage["prompt_tokens_details"]["public_cached_tokens"]
            private += usage["prompt_tokens_details"]["private_cached_tokens"]

    n, start = len(jobs), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    seconds = time.perf_counter() - start
    return {"requests_per_s": n / seconds, "public_cached": public, "private_cached": private}


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
        prompt = system + _text(args.suffix, rng)
        victim_sent = i % 2 == 0
        if victim_sent:
            await _complete(server, client, victim, prompt, 1)
        seconds, _ = await _complete(server, client, attacker, prompt, 1)
        latencies[victim_sent].append(seconds)
    return auc(latencies[True], latencies[False])


async def _round(server: LocalServer, args: argparse.Namespace, seed: int) -> dict[str, dict[str, float]]:
    rng = random.Random(seed)
    out: dict[str, dict[str, float]] = {}
    async with httpx.AsyncClient(base_url=server.url, timeout=600.0) as client:
        for setting in SETTINGS:
            system = _text(args.system, rng)
            await _admin(server, client, setting, system)
            record = await _throughput(server, client, system, args, rng)
            record["auc"] = await _distinguisher(server, client, system, args, rng)
            out[setting] = record
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--requests", type=int, default=2, help="requests per tenant per setting")
    parser.add_argument("--system", type=int, default=1792, help="system prompt tokens (context is 2,048)")
    parser.add_argument("--suffix", type=int, default=192, help="private suffix tokens")
    parser.add_argument("--probes", type=int, default=24, help="distinguisher probes per setting")
    parser.add_argument("--kv-blocks", type=int, default=1024)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig(
            max_num_seqs=CONCURRENCY,
            max_num_batched_tokens=1024,
            num_kv_blocks=args.kv_blocks,
            cache_dir=str(Path(tmp) / "model"),
        )
        server = start_local_server(config, Path(tmp), [(t, 1.0) for t in TENANTS])
        try:
            rounds = [asyncio.run(_round(server, args, seed)) for seed in range(args.rounds)]
        finally:
            server.stop()
    for r, result in enumerate(rounds, start=1):
        print(
            f"round {r}:", json.dumps({k: {m: round(v, 3) for m, v in d.items()} for k, d in result.items()})
        )
        print(
            f"round {r}: public / group throughput {result['public']['requests_per_s'] / result['group']['requests_per_s']:.3f}"
        )
    print("| setting | requests/s (median) | public cached | private cached | distinguisher AUC (median) |")
    print("|---|---|---|---|---|")
    for s in SETTINGS:
        med = {m: statistics.median(r[s][m] for r in rounds) for m in rounds[0][s]}
        print(
            f"| {s} | {med['requests_per_s']:.2f} | {med['public_cached']:.0f} | {med['private_cached']:.0f} "
            f"| {med['auc']:.2f} |"
        )


if __name__ == "__main__":
    main()
