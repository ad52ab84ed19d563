"""Fair at the door: an equal-weight tenant's success rate and latency beside each flood.

    .venv/bin/python -m bench.door            # about 1-2 minutes
    .venv/bin/python -m bench.door --quick    # a few seconds per phase (the test's run)

A `fairserve serve` subprocess (`--header-timeout 2`) with two tenants of weight 1: tenant A alone, then
beside one flood (in a child process), alternating, for each flood in turn. What each flood sends and
what is reported: docs/gateway.md, "Benchmark: fair at the door".
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from bench.harness import closed_loop, parser, served_model
from tests.gateway.serve_process import ServeProcess

FLOODS = (
    "queue",
    "refusable",
    "messages",
    "slow_headers",
    "spoofed_xff",
    "long_prefills",
    "long_prefill_one",
    "cached_prefills",
    "cached_prefill_one",
    "chat_empty",
    "chat_parts",
    "fresh_schemas",
    "schema_free",
)
# The `messages` flood's chat: 30,000 empty messages (990 KB, under the body cap), refused whatever it
# costs to find out (issue #45: it held the event loop for 0.28 s each).
FLOOD_MESSAGES = 30_000
# Issue 45: B's closed loops of distinct 2,047-token prompts (the prefix cache cannot shorten them)
LONG_PREFILL_LOOPS = {"long_prefills": 62, "long_prefill_one": 1}
# Issue 54: B's closed loops re-sending cached 2,047-token prompts (`max_tokens` 1), so only the tail past the
# cached blocks is new each time; the step cost model (engine/core/step_cost.py) must keep A's steps bounded.
CACHED_PREFILL_LOOPS = {"cached_prefills": 48, "cached_prefill_one": 1}
# Issue 54: chats under the message cap that still cost their CPU to render (`chat_empty`: 2,048 empty
# messages; `chat_parts`: 2,048 one-part content lists), and B's 8 loops each sending a fresh 30-property
# schema (`fresh_schemas`): preprocessing CPU, which must be B's own and bounded. `schema_free` is the same
# 8 loops without a schema, the control: what B's answers themselves cost A.
CHAT_FLOOD_MESSAGES = 2048
SCHEMA_LOOPS, SCHEMA_PROPERTIES = 8, 30


def chat_flood(kind: str, model: str) -> dict[str, Any]:
    """The body of a `chat_empty` or `chat_parts` flood request (under the message cap)."""
    content: str | list[dict[str, str]] = "" if kind == "chat_empty" else [{"type": "text", "text": ""}]
    return {"model": model, "messages": [{"role": "user", "content": content}] * CHAT_FLOOD_MESSAGES}


def fresh_schema(model: str, rng: random.Random | None) -> bytes:
    """A chat whose `response_format` is a schema never sent before: 30 properties of random names (without
    `rng`, the same chat with no schema)."""
    body: dict[str, Any] = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    if rng is not None:
        props = {f"p{rng.getrandbits(48):x}": {"type": "integer"} for _ in range(SCHEMA_PROPERTIES)}
        schema = {"type": "object", "properties": props, "required": list(props)[:3]}
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "fresh", "schema": schema}}
    return json.dumps(body).encode()


def make_tenant(url: str, admin_token: str, name: str, **fields: Any) -> str:
    """Create a tenant of weight 1 through the admin API; returns its key."""
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {admin_token}"}, timeout=30) as c:
        tenant = c.post("/admin/api/tenants", json={"name": name, "weight": 1.0, **fields}).json()
        return str(c.post(f"/admin/api/tenants/{tenant['id']}/keys", json={"name": "bench"}).json()["secret"])


async def clients(
    url: str,
    n: int,
    seconds: float,
    body: bytes | Callable[[], bytes],
    headers: Any,
    source: str | None = None,
    path: str = "/v1/completions",
) -> list[tuple[int, float]]:
    """`n` closed-loop clients POSTing `body` (or a fresh `body()` each time) to `path` for `seconds`, from
    `source` (a local address) if given: (status, seconds) of each request, status 0 for an error."""
    out: list[tuple[int, float]] = []
    transport = httpx.AsyncHTTPTransport(local_address=source) if source else None
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=n)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits, transport=transport) as client:

        async def once(_: int) -> None:
            content = body if isinstance(body, bytes) else body()
            start, given = time.perf_counter(), {"Content-Type": "application/json", **headers()}
            try:
                status = (await client.post(path, content=content, headers=given)).status_code
            except httpx.HTTPError:
                status = 0
            out.append((status, time.perf_counter() - start))

        await closed_loop(n, time.monotonic() + seconds, once)
    return out


async def slow_headers(url: str, n: int, seconds: float) -> Counter[str]:
    """`n` connections from 127.0.0.2 sending header bytes one a second; each one the server closes is
    counted and replaced."""
    host, port = url.removeprefix("http://").split(":")
    counts: Counter[str] = Counter()
    until = time.monotonic() + seconds

    async def one() -> None:
        while time.monotonic() < until:
            try:
                reader, writer = await asyncio.open_connection(host, int(port), local_addr=("127.0.0.2", 0))
            except OSError:
                counts["connect_failed"] += 1
                await asyncio.sleep(0.1)  # pacing a refused reconnect, not waiting for a condition
                continue
            counts["opened"] += 1
            writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            try:
                while time.monotonic() < until:
                    writer.write(b"a")
                    await writer.drain()
                    if await asyncio.wait_for(reader.read(1), 1.0) == b"":
                        counts["closed_by_server"] += 1
                        break
            except TimeoutError:
                pass  # the phase ended while the connection was still open
            except OSError:
                counts["closed_by_server"] += 1
            finally:
                writer.close()
            await asyncio.sleep(0.5)  # reopening half a second after a close: holding, not an accept flood

    await asyncio.gather(*(one() for _ in range(n)))
    return counts


def flood(kind: str, url: str, key: str, seconds: float, results: Any) -> None:
    """Child process: run one flood for `seconds` and put what it got back on `results`."""
    if kind == "slow_headers":
        results.put(dict(asyncio.run(slow_headers(url, 300, seconds))))
        return
    model, auth = served_model(url, key), {"Authorization": f"Bearer {key}"}
    n, source = 4, None
    prompt: str | list[int] = "x" * (256 * 1024)  # refusable: only a refusal can answer these
    if kind == "queue":
        n, prompt = 140, [65] * 2047
    elif kind == "spoofed_xff":
        n, source, prompt = 4, "127.0.0.3", "x"
    fields: dict[str, Any] = {"prompt": prompt}
    path = "/v1/completions"
    if kind == "messages":
        fields, path = (
            {"messages": [{"role": "user", "content": ""}] * FLOOD_MESSAGES},
            "/v1/chat/completions",
        )
    if kind in ("chat_empty", "chat_parts"):
        fields, path = chat_flood(kind, model), "/v1/chat/completions"
    body: bytes | Callable[[], bytes] = json.dumps({"model": model, **fields, "max_tokens": 1}).encode()
    if kind in ("fresh_schemas", "schema_free"):
        n, path = SCHEMA_LOOPS, "/v1/chat/completions"
        schema_rng = random.Random() if kind == "fresh_schemas" else None

        def body() -> bytes:
            return fresh_schema(model, schema_rng)

    if kind in LONG_PREFILL_LOOPS:
        n, rng = LONG_PREFILL_LOOPS[kind], random.Random()  # fresh prompts each phase: none cached before

        def body() -> bytes:  # printable byte tokens, a new prompt each time
            tokens = [rng.randrange(32, 127) for _ in range(2047)]
            return json.dumps({"model": model, "prompt": tokens, "max_tokens": 1}).encode()

    if kind in CACHED_PREFILL_LOOPS:
        n, seed = CACHED_PREFILL_LOOPS[kind], random.Random(kind)
        # One prompt per loop, the same every time it comes round: all cached after the first round.
        prompts = itertools.cycle(
            [
                json.dumps(
                    {
                        "model": model,
                        "prompt": [seed.randrange(32, 127) for _ in range(2047)],
                        "max_tokens": 1,
                    }
                ).encode()
                for _ in range(n)
            ]
        )

        def body() -> bytes:
            return next(prompts)

    def headers() -> dict[str, str]:  # spoofed: a bad key, each request claiming another client address
        if kind != "spoofed_xff":
            return auth
        return {"Authorization": "Bearer fs-bad", "X-Forwarded-For": f"10.{random.randrange(1 << 16)}.0.1"}

    out = asyncio.run(clients(url, n, seconds, body, headers, source, path))
    results.put(dict(Counter(str(status) for status, _ in out)))


def phase(url: str, a_key: str, model: str, seconds: float, kind: str | None, b_key: str) -> dict[str, Any]:
    """Tenant A for `seconds`, alone or beside the flood `kind` (in a child process)."""
    results: Any = mp.get_context("spawn").Queue()
    child = None
    if kind is not None:
        child = mp.get_context("spawn").Process(target=flood, args=(kind, url, b_key, seconds + 1.0, results))
        child.start()
        time.sleep(1.0)  # the flood's warm-up (a phase boundary, not a synchronisation)
    body = json.dumps({"model": model, "prompt": [65] * 100, "max_tokens": 1}).encode()
    auth = {"Authorization": f"Bearer {a_key}"}
    out = asyncio.run(clients(url, 4, seconds, body, lambda: auth))
    got = {} if child is None else results.get(timeout=seconds + 120)
    if child is not None:
        child.join(30)
    ok = [s for status, s in out if status == 200]
    return {"sent": len(out), "ok": len(ok), "p50_s": statistics.median(ok) if ok else None, "flood": got}


def run(seconds: float, rounds: int, floods: tuple[str, ...] = FLOODS, *serve_args: str) -> dict[str, Any]:
    """Alternate A alone and A beside each flood, `rounds` times; the report per flood. `serve_args` go to
    `fairserve serve`; with `--loop-debug`, the report lists the event-loop callbacks it logged as slow."""
    with tempfile.TemporaryDirectory() as data_dir:
        server = ServeProcess(Path(data_dir), "--header-timeout", "2", *serve_args)
        try:
            url, admin = server.url, server.banner["admin_token"]
            a_key = make_tenant(url, admin, "door-a")
            b_key = make_tenant(url, admin, "door-b", max_queued_requests=200)
            name = served_model(url, a_key)
            alone: list[dict[str, Any]] = []
            beside: dict[str, list[dict[str, Any]]] = {k: [] for k in floods}
            for _ in range(rounds):
                for kind in floods:
                    alone.append(phase(url, a_key, name, seconds, None, b_key))
                    beside[kind].append(phase(url, a_key, name, seconds, kind, b_key))
        finally:
            server.stop()
    out = report(alone, beside)
    if "--loop-debug" in serve_args:
        out["slow_callbacks"] = [
            line.strip() for line in server.output if "Executing" in line and " took " in line
        ]
    return out


def report(alone: list[dict[str, Any]], beside: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Success rate and p50 ratio per flood, and what each flood got back (summed over rounds)."""
    base = statistics.median(p["p50_s"] for p in alone if p["p50_s"] is not None)
    out: dict[str, Any] = {"alone": {"p50_ms": round(base * 1e3, 2), "ok": sum(p["ok"] for p in alone)}}
    medians: dict[str, float] = {}
    for kind, phases in beside.items():
        sent, ok = sum(p["sent"] for p in phases), sum(p["ok"] for p in phases)
        # Each phase beside the flood against the phase alone just before it (`run` alternates them).
        paired = [
            p["ok"] / a["ok"]
            for p, a in zip(phases, alone[list(beside).index(kind) :: len(beside)], strict=True)
            if a["ok"]
        ]
        p50s = [p["p50_s"] for p in phases if p["p50_s"] is not None]
        flood_got = sum((Counter(p["flood"]) for p in phases), Counter[str]())
        if p50s:
            medians[kind] = statistics.median(p50s)
        out[kind] = {
            "success_rate": round(ok / sent, 4) if sent else None,
            "p50_ms": round(medians[kind] * 1e3, 2) if p50s else None,
            "p50_ratio": round(medians[kind] / base, 2) if p50s else None,
            # A's answers in a phase beside the flood over its answers in the phase alone before it (median)
            "answers_ratio": round(statistics.median(paired), 2) if paired else None,
            "sent": sent,
            "flood": dict(flood_got),
        }
    if "long_prefills" in medians and "long_prefill_one" in medians:
        # Issue 45's ratio: the depth of B's queue must not reach A (target <= 1.5)
        out["long_prefills_over_one"] = round(medians["long_prefills"] / medians["long_prefill_one"], 2)
    if "cached_prefills" in medians and "cached_prefill_one" in medians:
        # Issue 54's ratio: 48 loops of cached prompts over one (target <= 2; x13-19 before the step cost)
        out["cached_prefills_over_one"] = round(medians["cached_prefills"] / medians["cached_prefill_one"], 2)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run and print the JSON report."""
    p = parser(
        __doc__,
        phase=(6.0, "seconds per phase"),
        rounds=(1, "alternations of alone/flood per flood"),
        floods=(",".join(FLOODS), "which floods, comma-separated"),
    )
    p.add_argument("--quick", action="store_true", help="1.5-second phases, one round (for a test)")
    p.prog = "python -m bench.door"
    args = p.parse_args(argv)
    floods = tuple(f for f in args.floods.split(",") if f in FLOODS)
    result = run(1.5 if args.quick else args.phase, 1 if args.quick else args.rounds, floods)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
