"""vtc-locality against vtc on the real engine (issue 33): few public prompt families, many tenants.

    .venv/bin/python -m bench.locality [--rounds 2] [--seconds 20]

One CPU engine (the embedded default model) behind the real gateway, over real HTTP, per run; runs of
the two policies alternate within each round. 16 tenants, two closed-loop streams each (32 in flight
for 8 seats, so the queue is never empty); every request is one of 12 prompt families of `--family`
tokens, each registered as a public prefix, plus a private 32-token suffix, 8 output tokens. The KV
cache (`--kv-blocks` of 16 tokens) holds only some families at once.

Reported per run: completed requests per second in the measured window, and the largest spread of
charged service gained in the window between tenants (sampled every 0.5 s), with the bound
2·max(w_in·L_in, w_out·M) (+ Δ for vtc-locality), M the KV cache's tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import string
import tempfile
import time
from pathlib import Path

import httpx

from bench.flows import tenant_service
from bench.server import LocalServer, start_local_server
from engine import EngineConfig
from fairness import FairnessConfig

TENANTS = [f"t{i:02d}" for i in range(16)]
POLICIES = ("vtc", "vtc-locality")
WARMUP_S = 3.0


def _text(n: int, rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_lowercase + " ") for _ in range(n))


def serve(policy: str, data_dir: Path, kv_blocks: int) -> LocalServer:
    """A gateway over a fresh 8-seat CPU engine under `policy` (one class, the tree's Δ)."""
    config = EngineConfig(
        max_num_seqs=8,
        max_num_batched_tokens=1024,
        num_kv_blocks=kv_blocks,
        cache_dir=str(data_dir / "model"),
        fairness=FairnessConfig(policy=policy, priority_classes=False),
    )
    return start_local_server(config, data_dir, [(t, 1.0) for t in TENANTS])


async def _run(server: LocalServer, families: list[str], seconds: float, seed: int) -> dict[str, float]:
    admin = {"Authorization": f"Bearer {server.state.admin_token}"}
    start = time.monotonic()
    window = (start + WARMUP_S, start + WARMUP_S + seconds)
    done = 0
    spread = 0.0

    async def stream(client: httpx.AsyncClient, tenant: str, rng: random.Random) -> None:
        nonlocal done
        headers = {"Authorization": f"Bearer {server.keys[tenant]}"}
        while time.monotonic() < window[1]:
            prompt = rng.choice(families) + _text(32, rng)
            body = {"model": server.model, "prompt": prompt, "max_tokens": 8, "ignore_eos": True}
            resp = await client.post("/v1/completions", json=body, headers=headers)
            resp.raise_for_status()
            if window[0] <= time.monotonic() <= window[1]:
                done += 1

    async def sample() -> None:
        nonlocal spread
        await asyncio.sleep(WARMUP_S)
        before = tenant_service(server)
        while time.monotonic() < window[1]:
            await asyncio.sleep(0.5)
            now = tenant_service(server)
            gained = [now.get(t, 0.0) - before.get(t, 0.0) for t in TENANTS]
            spread = max(spread, max(gained) - min(gained))

    async with httpx.AsyncClient(base_url=server.url, timeout=600.0) as client:
        for i, text in enumerate(families):
            body = {"model": server.model, "name": f"family-{i}", "text": text}
            (await client.post("/admin/api/prefixes", json=body, headers=admin)).raise_for_status()
        rngs = [random.Random(seed * 1000 + i) for i in range(2 * len(TENANTS))]
        tasks = [stream(client, TENANTS[i % len(TENANTS)], rngs[i]) for i in range(2 * len(TENANTS))]
        await asyncio.gather(sample(), *tasks)
    return {"requests_per_s": done / seconds, "max_service_difference": spread}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--families", type=int, default=12)
    parser.add_argument("--family", type=int, default=1024, help="tokens per family prefix")
    parser.add_argument("--kv-blocks", type=int, default=512)
    args = parser.parse_args(argv)
    slack = FairnessConfig().locality_slack
    bound = 2 * max(args.family + 32.0, 2.0 * args.kv_blocks * 16)
    ratios = []
    for r in range(args.rounds):
        rng = random.Random(r)
        families = [_text(args.family, rng) for _ in range(args.families)]
        record: dict[str, dict[str, float]] = {}
        for policy in POLICIES:
            with tempfile.TemporaryDirectory() as tmp:
                server = serve(policy, Path(tmp), args.kv_blocks)
                try:
                    record[policy] = asyncio.run(_run(server, families, args.seconds, r))
                finally:
                    server.stop()
        ratios.append(record["vtc-locality"]["requests_per_s"] / record["vtc"]["requests_per_s"])
        print(f"round {r + 1}:", json.dumps(record), f"ratio {ratios[-1]:.3f}")
    print(f"bound: vtc {bound:.0f}, vtc-locality {bound + slack:.0f} (delta {slack:.0f})")
    print("throughput ratio vtc-locality / vtc per round:", ", ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
