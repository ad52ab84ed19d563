"""vtc-locality against vtc on the real engine: few public prompt families, many tenants.

    .venv/bin/python -m bench.locality [--rounds 2] [--seconds 20]

Per run one CPU engine (the embedded model, 8 seats) behind the gateway, over HTTP; the two policies
alternate within each round. 16 tenants, two closed-loop streams each; each request is one of `--families`
prompt families of `--family` tokens, each a public prefix, plus a private 32-token suffix, 8 output
tokens; the KV cache (`--kv-blocks` of 16 tokens) holds only some families at once. Reported per run:
completed requests/s in the window, and the largest spread of charged service gained in the window
between tenants (sampled every 0.5 s), against the bound 2·max(w_in·L_in, w_out·M) (+ Δ for vtc-locality).
"""

from __future__ import annotations

import asyncio
import json
import random
import time

import httpx

from bench.flows import tenant_service
from bench.harness import closed_loop, parser, text
from bench.server import LocalServer, local_gateway
from fairness import FairnessConfig

TENANTS = [f"t{i:02d}" for i in range(16)]
POLICIES = ("vtc", "vtc-locality")
WARMUP_S = 3.0


async def _run(server: LocalServer, families: list[str], seconds: float, seed: int) -> dict[str, float]:
    start = time.monotonic()
    window = (start + WARMUP_S, start + WARMUP_S + seconds)
    rngs = [random.Random(seed * 1000 + i) for i in range(2 * len(TENANTS))]
    done, spread = 0, 0.0

    async def stream(i: int) -> None:
        nonlocal done
        prompt = rngs[i].choice(families) + text(32, rngs[i])
        tenant = TENANTS[i % len(TENANTS)]
        resp = await server.complete(client, tenant, prompt=prompt, max_tokens=8, ignore_eos=True)
        resp.raise_for_status()
        done += window[0] <= time.monotonic() <= window[1]

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
        for i, family in enumerate(families):
            body = {"model": server.model, "name": f"family-{i}", "text": family}
            (await client.post("/admin/api/prefixes", json=body, headers=server.admin())).raise_for_status()
        await asyncio.gather(sample(), closed_loop(len(rngs), window[1], stream))
    return {"requests_per_s": done / seconds, "max_service_difference": spread}


def main(argv: list[str] | None = None) -> None:
    family_help = "tokens per family prefix"
    args = parser(
        __doc__, rounds=2, seconds=20.0, families=12, family=(1024, family_help), kv_blocks=512
    ).parse_args(argv)
    slack = FairnessConfig().locality_slack
    bound = 2 * max(args.family + 32.0, 2.0 * args.kv_blocks * 16)
    ratios = []
    for r in range(args.rounds):
        rng = random.Random(r)
        families = [text(args.family, rng) for _ in range(args.families)]
        record: dict[str, dict[str, float]] = {}
        for policy in POLICIES:
            fairness = FairnessConfig(policy=policy, priority_classes=False)
            engine = {"max_num_seqs": 8, "max_num_batched_tokens": 1024, "num_kv_blocks": args.kv_blocks}
            with local_gateway(TENANTS, fairness=fairness, **engine) as server:
                record[policy] = asyncio.run(_run(server, families, args.seconds, r))
        ratios.append(record["vtc-locality"]["requests_per_s"] / record["vtc"]["requests_per_s"])
        print(f"round {r + 1}:", json.dumps(record), f"ratio {ratios[-1]:.3f}")
    print(f"bound: vtc {bound:.0f}, vtc-locality {bound + slack:.0f} (delta {slack:.0f})")
    print("throughput ratio vtc-locality / vtc per round:", ", ".join(f"{x:.3f}" for x in ratios))


if __name__ == "__main__":
    main()
