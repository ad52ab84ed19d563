"""Structured outputs on the real engine: their cost, and whether one tenant's grammar work is its own.

    .venv/bin/python -m bench.structured [--schema-dir DIR] [--seconds 15] [--rounds 2] [--device cuda]

`--schema-dir` adds every *.json schema under DIR (e.g. a checkout of JSONSchemaBench's data/Github_hard
and data/Github_ultra) to the built-in hard ones (nested `oneOf`, a 5,000-value enum, long patterns).
Reported, each from running code:
- compile ms p50/p99 over the schema set (llguidance on the engine's tokenizer, thread CPU), and how many
  schemas were refused (an unimplemented keyword, an unknown format: a 400 over HTTP);
- mask us per token p50/p99: each compiled schema driven 48 tokens by a seeded walk over its allowed tokens;
- json_schema tokens/s against unconstrained on the same prompts and output lengths, over HTTP;
- isolation: tenant A floods every compiled schema (16 in flight) beside tenant B's plain chat streams
  (16), equal weights, 8 seats, the engine in its worker process; then the same flood without
  response_format, each request as long as its constrained twin. B's TPOT with the schema flood over its TPOT
  with the plain one, B's share of service in the window, A's statuses; the engine alive.
Results: docs/engine.md, "Grammars".
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from bench.flows import tenant_service
from bench.harness import closed_loop, parser
from bench.server import LocalServer, start_local_server
from engine import EngineConfig, ProcessEngine
from engine.core.sampling_params import Grammar
from engine.worker.grammar.backend import Backend, GrammarError
from engine.worker.grammar.config import GrammarConfig
from engine.worker.loader import load_model

WARMUP_S = 2.0
MAX_TOKENS = 24  # flood outputs: constrained ones mostly run to it, as the unconstrained ones do


def hard_schemas() -> dict[str, dict[str, Any]]:
    """Schemas chosen to be expensive: deep nested oneOf, a huge enum, long regex patterns."""
    nested: dict[str, Any] = {"type": "integer"}
    for depth in range(6):
        nested = {
            "oneOf": [
                {"type": "object", "properties": {f"k{depth}": nested}, "required": [f"k{depth}"]},
                {"type": "array", "items": nested, "maxItems": 3},
                {"type": "string", "maxLength": 4},
            ]
        }
    enum = {
        "type": "object",
        "properties": {"v": {"enum": [f"value-{i:05d}-{i * 7919 % 10007}" for i in range(5000)]}},
    }
    pattern = {
        "type": "object",
        "properties": {
            f"p{i}": {
                "type": "string",
                "pattern": "^("
                + "|".join(
                    f"[a-z]{{{j}}}[0-9]{{{(i + j) % 7 + 1}}}-(x|y|z){{2,{j + 2}}}" for j in range(1, 12)
                )
                + ")$",
            }
            for i in range(8)
        },
    }
    # Its branches are of disjoint types, so llguidance can enforce oneOf (overlapping ones it refuses);
    # the same nesting with anyOf beside it.
    nested_any = json.loads(json.dumps(nested).replace('"oneOf"', '"anyOf"'))
    return {"nested-oneOf": nested, "nested-anyOf": nested_any, "enum-5000": enum, "long-patterns": pattern}


def load_schemas(schema_dir: str | None) -> dict[str, dict[str, Any]]:
    """The built-in hard schemas plus every JSON object schema under `schema_dir`."""
    schemas = hard_schemas()
    for path in sorted(Path(schema_dir).rglob("*.json")) if schema_dir else []:
        try:
            loaded = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError):
            continue
        if isinstance(loaded, dict):
            schemas[f"{path.parent.name}/{path.stem}"] = loaded
    return schemas


def compile_and_mask(schemas: dict[str, dict[str, Any]]) -> tuple[dict[str, float], list[float], list[str]]:
    """Compile ms per schema that compiles, mask us of every masked token, and the refused schemas' names."""
    from llguidance.numpy import allocate_token_bitmask, fill_next_token_bitmask

    loaded = load_model(None, dtype="auto", device="cpu")
    eos = sorted(set(loaded.tokenizer.eos_token_ids))
    backend = Backend(loaded.tokenizer.to_json(), loaded.config.vocab_size, eos, GrammarConfig())
    backend.tokenizer()
    compile_ms: dict[str, float] = {}
    mask_us: list[float] = []
    refused: list[str] = []
    rng = random.Random(0)
    for name, schema in schemas.items():
        t0 = time.thread_time()
        try:
            matcher = backend.compile(Grammar("json_schema", json.dumps(schema)))
        except GrammarError:
            refused.append(name)
            continue
        compile_ms[name] = (time.thread_time() - t0) * 1e3
        mask = allocate_token_bitmask(1, backend.vocab_size)
        for _ in range(48):
            t0 = time.thread_time()
            fill_next_token_bitmask(matcher, mask, 0)
            mask_us.append((time.thread_time() - t0) * 1e6)
            bits = np.nonzero(np.unpackbits(mask[0].view(np.uint8), bitorder="little"))[0]
            allowed = [int(t) for t in bits if t < backend.vocab_size and t not in eos]
            if matcher.is_error() or not allowed:
                break
            matcher.consume_token(rng.choice(allowed))
    return compile_ms, mask_us, refused


def _fmt(schema: dict[str, Any]) -> dict[str, Any]:
    return {"type": "json_schema", "json_schema": {"name": "out", "schema": schema, "strict": True}}


async def _stream(
    client: httpx.AsyncClient, server: LocalServer, tenant: str, body: dict[str, Any]
) -> tuple[int, list[float]]:
    """POST a streaming completion; (status, arrival times of its text chunks)."""
    auth = {"Authorization": f"Bearer {server.keys[tenant]}"}
    times: list[float] = []
    async with client.stream(
        "POST", "/v1/completions", json={"model": server.model, "stream": True, **body}, headers=auth
    ) as resp:
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and '"text":""' not in line:
                times.append(time.monotonic())
    return resp.status_code, times


async def throughput(
    server: LocalServer, schemas: list[dict[str, Any]], seconds: float, rounds: int
) -> list[float]:
    """Constrained over unconstrained tokens/s per round: 8 clients over the same prompts, the unconstrained
    half asking each request for exactly as many tokens as its constrained twin produced. The schemas are
    compiled (cached) first, and the halves alternate: this machine's load drifts between runs."""
    lengths: list[int] = []

    async def run(constrained: bool, span: float) -> float:
        tokens, count = 0, 0
        until = time.monotonic() + span

        async def once(i: int) -> None:
            nonlocal tokens, count
            k = count
            count += 1
            body: dict[str, Any] = {"prompt": f"record {k % 50}", "max_tokens": 64, "temperature": 0.0}
            if constrained:
                body["response_format"] = _fmt(schemas[k % len(schemas)])
            else:
                body |= {"max_tokens": lengths[k % len(lengths)], "ignore_eos": True}
            resp = await server.complete(client, "B", **body)
            if resp.status_code == 200:
                used = resp.json()["usage"]["completion_tokens"]
                tokens += used
                if constrained:
                    lengths.append(used)

        start = time.monotonic()
        async with httpx.AsyncClient(base_url=server.url, timeout=120.0) as client:
            await closed_loop(8, until, once)
        return tokens / (time.monotonic() - start)

    await run(True, 2.0 + len(schemas) * 0.05)  # warm: every schema compiled and cached
    ratios = []
    for _ in range(rounds):
        constrained = await run(True, seconds)
        ratios.append(constrained / await run(False, seconds))
    return ratios


async def isolation(
    server: LocalServer, schemas: list[dict[str, Any]], seconds: float, lengths: list[int] | None
) -> dict[str, Any]:
    """A floods (16 in flight), B streams plain chat (16 in flight, so both are backlogged): B's TPOT and
    share of service, A's statuses and output lengths. `lengths` None: A's flood carries the schemas; else
    it is the same flood without them, each request asking for the length its constrained twin produced
    (so the batch is the same and only the grammar work differs)."""
    start = time.monotonic()
    window = (start + WARMUP_S, start + WARMUP_S + seconds)
    tpot: list[float] = []
    statuses: dict[int, int] = {}
    produced: list[int] = []  # A's output lengths (text chunks: one a token with the byte tokenizer)
    sent = 0

    async def once(i: int) -> None:
        nonlocal sent
        if i < 16:  # tenant A's flood
            body: dict[str, Any] = {
                "prompt": f"fill {sent % 97}",
                "max_tokens": MAX_TOKENS,
                "temperature": 1.0,
            }
            if lengths is None:
                body["response_format"] = _fmt(schemas[sent % len(schemas)])
            else:
                body |= {"ignore_eos": True, "max_tokens": lengths[sent % len(lengths)]}
            sent += 1
            status, times = await _stream(client, server, "A", body)
            statuses[status] = statuses.get(status, 0) + 1
            produced.append(max(1, len(times)))
            return
        began = time.monotonic()
        _, times = await _stream(
            client, server, "B", {"prompt": "chat", "max_tokens": 32, "ignore_eos": True}
        )
        if len(times) > 2 and window[0] <= began and times[-1] <= window[1]:
            tpot.append((times[-1] - times[0]) / (len(times) - 1))

    async def sample() -> dict[str, float]:
        await asyncio.sleep(WARMUP_S)
        before = tenant_service(server)
        await asyncio.sleep(seconds)
        after = tenant_service(server)
        return {t: after.get(t, 0.0) - before.get(t, 0.0) for t in ("A", "B")}

    async with httpx.AsyncClient(
        base_url=server.url, timeout=120.0, limits=httpx.Limits(max_connections=64)
    ) as client:
        service, _ = await asyncio.gather(sample(), closed_loop(32, window[1], once))
    return {
        "tpot_s": statistics.median(tpot) if tpot else float("nan"),
        "share_b": service["B"] / max(1e-9, service["A"] + service["B"]),
        "statuses": statuses,
        "lengths": produced,
        "alive": server.engine.stats().alive,
    }


async def refusals(server: LocalServer, schemas: list[dict[str, Any]]) -> int:
    """How many of `schemas` the server answers 400 (each sent once, as tenant A, for one token)."""
    async with httpx.AsyncClient(base_url=server.url, timeout=120.0) as client:
        statuses = [
            (
                await server.complete(client, "A", prompt="x", max_tokens=1, response_format=_fmt(s))
            ).status_code
            for s in schemas
        ]
    return statuses.count(400)


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


def main() -> None:
    args = parser(
        __doc__, schema_dir=None, seconds=15.0, rounds=2, throughput_seconds=10.0, device="cpu"
    ).parse_args()
    schemas = load_schemas(args.schema_dir)
    compile_ms, mask_us, refused = compile_and_mask(schemas)
    ms = list(compile_ms.values())
    print(f"schemas: {len(schemas)} ({len(compile_ms)} compiled, {len(refused)} refused by llguidance)")
    print(f"compile ms p50 {_pct(ms, 50):.2f}  p99 {_pct(ms, 99):.2f}  max {max(ms):.1f}")
    print(f"mask us/token p50 {_pct(mask_us, 50):.1f}  p99 {_pct(mask_us, 99):.1f}  ({len(mask_us)} masks)")
    flood = [schemas[n] for n in compile_ms]  # the refused ones are 400s at once (counted below)
    public = [schemas[n] for n in compile_ms if n not in hard_schemas()] or flood
    with tempfile.TemporaryDirectory() as tmp:
        config = EngineConfig(
            max_num_seqs=8,
            max_num_batched_tokens=256,
            num_kv_blocks=512,
            cache_dir=str(Path(tmp) / "model"),
            device=args.device,
        )
        # The engine in its own process, as `fairserve serve` runs it: the gateway's parsing of A's schema-laden
        # bodies then competes with the engine for cores, not for this process's GIL.
        engine = ProcessEngine(config)
        engine.start()
        server = start_local_server(config, Path(tmp), [("A", 1.0), ("B", 1.0)], engine)
        try:
            ratios = asyncio.run(throughput(server, public, args.throughput_seconds, args.rounds * 2))
            print(
                f"tokens/s json_schema / unconstrained: median {statistics.median(ratios):.2f} "
                f"(rounds: {', '.join(f'{r:.2f}' for r in ratios)})"
            )
            refused_http = asyncio.run(refusals(server, [schemas[n] for n in refused]))
            print(f"refused over HTTP: {refused_http} of {len(refused)}")
            asyncio.run(refusals(server, flood))  # compiled and cached before the rounds: a steady flood
            rows = []
            for r in range(args.rounds):
                lengths: list[int] | None = None
                for with_schemas in (True, False):
                    result = asyncio.run(isolation(server, flood, args.seconds, lengths))
                    lengths = result.pop("lengths")
                    rows.append((with_schemas, result))
                    print(f"round {r} flood {'schemas' if with_schemas else 'plain  '}: {rows[-1][1]}")
            tpot = {w: statistics.median(x["tpot_s"] for ws, x in rows if ws == w) for w in (True, False)}
            share = min(x["share_b"] for ws, x in rows if ws)
            print(
                f"B TPOT beside schema flood / beside plain flood: {tpot[True] / tpot[False]:.2f} "
                f"({tpot[True] * 1e3:.1f} / {tpot[False] * 1e3:.1f} ms); B share (min) {share:.3f}"
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
