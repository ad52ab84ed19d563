"""Where a request's gateway CPU goes, by stage: the same server stopped after each stage in turn.

    .venv/bin/python -m experiments.gateway_stages [--rounds 3] [--requests 1500]

Sampling profilers split the gateway's CPU by the frames they catch, and on a shared 2-core VM they
count a thread that waits for a core as busy (docs/gateway.md, "Profile"). This measures instead: each
variant is `fairserve serve` with its generation pipeline cut after one stage (answering a fixed JSON
body there), driven by bench/gateway_cpu.py's closed-loop `max_tokens: 1` load, its CPU read from
/proc (every thread, less the idle rate). A stage's cost is the difference between the variant that
stops after it and the one that stops before it; the floor (bare Starlette on the same uvicorn) is
measured in the same rounds.

    edge      the edge middleware (request id, body read) and the route, nothing else
    door      + draining check, authentication, overload shedding
    parse     + headers, the body's validation, tokenising, the engine's checks
    admit     + request-id checks, deadline, queue bounds and quota (the slot released at once)
    no-ledger + the engine request, its reply and the run's end, without the ledger row
    full      + the ledger row (journal line, buffer, the writer thread's SQL)

Run with `--serve STAGE serve ARGS...` it is the server itself (what the driver starts).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

STAGES = ("edge", "door", "parse", "admit", "no-ledger", "full")
_BODY = json.dumps(
    {
        "id": "cmpl-0",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 6, "completion_tokens": 1, "total_tokens": 7},
    }
).encode()


def cut_pipeline(stage: str) -> None:
    """Patch the generation pipeline to answer `_BODY` right after `stage` (no patch for `full`)."""
    from starlette.responses import Response

    from gateway.openai import generation, submit
    from gateway.openai.parsing import request_headers

    if stage == "no-ledger":
        submit._record = lambda *args: None
        return
    if stage == "full":
        return

    async def cut(request: Any, state: Any, chat: bool, trace: Any, caller: Any = None) -> Any:
        canned = Response(_BODY, media_type="application/json")
        if stage == "edge":
            return canned
        headers = request_headers(request.scope)
        caller = caller or await generation.door(request, state, headers)
        if stage == "door":
            return canned
        ctx = await generation.parse(request, state, caller, chat, headers)
        if stage == "parse":
            return canned
        _, admission = await generation.admit(state, ctx, trace)
        admission.slot.release()
        return canned

    generation._pipeline = cut


async def measure(stage: str, args: argparse.Namespace, root: Path) -> float:
    """ms of gateway CPU per `max_tokens: 1` request of one server cut at `stage` ("floor": the floor)."""
    from bench.gateway_cpu import PROMPT, Server

    if stage == "floor":
        server = Server("floor", ["-m", "bench.gateway_floor"])
    else:
        data = tempfile.mkdtemp(dir=root)
        serve = [
            "-m",
            "experiments.gateway_stages",
            "--serve",
            stage,
            "serve",
            "--port",
            "0",
            "--data-dir",
            data,
        ]
        server = Server(stage, serve)
    try:
        body = {"model": "m", "prompt": PROMPT, "ignore_eos": True, "max_tokens": 1}
        if stage != "floor":
            conn = await asyncio.open_connection(*server.addr)
            body["model"] = json.loads((await server.request(conn, server.raw("GET")))[1])["data"][0]["id"]
            conn[1].close()
        return await server.measure(body, args, None)
    finally:
        server.stop()


async def run(args: argparse.Namespace) -> dict[str, list[float]]:
    """Every stage and the floor, once a round, in an order that alternates between rounds."""
    order = ["floor", *STAGES]
    samples: dict[str, list[float]] = {s: [] for s in order}
    root = Path(tempfile.mkdtemp(prefix="gateway-stages-"))
    try:
        for r in range(args.rounds):
            for stage in order if r % 2 == 0 else order[::-1]:
                samples[stage].append(await measure(stage, args, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return samples


def table(samples: dict[str, list[float]]) -> str:
    """Markdown: each variant's median, the stage's own cost (its median less the one before), the floor."""
    floor = statistics.median(samples["floor"])
    lines = [
        "| variant | ms / request (median) | the stage's own cost, ms | ÷ floor |",
        "|---|---|---|---|",
        f"| floor | {floor:.3f} | | 1 |",
    ]
    before = None
    for stage in STAGES:
        ms = statistics.median(samples[stage])
        own = "" if before is None else f"{ms - before:+.3f}"
        lines.append(f"| {stage} | {ms:.3f} | {own} | {ms / floor:.1f}× |")
        before = ms
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Drive the variants (or, with --serve, be one)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--serve"]:
        cut_pipeline(argv[1])
        from gateway.cli import main as fairserve

        return fairserve(argv[2:])
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--requests", type=int, default=1500)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--idle-s", type=float, default=1.0)
    args = p.parse_args(argv)
    import uvloop

    started = time.perf_counter()
    samples = uvloop.run(run(args))
    print(table(samples))
    print(json.dumps({k: [round(v, 4) for v in vs] for k, vs in samples.items()}))
    print(f"({args.rounds} rounds of {args.requests} requests, {time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
