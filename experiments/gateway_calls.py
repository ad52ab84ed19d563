"""Python function calls per request: fairserve's gateway against the bare Starlette floor.

    .venv/bin/python -m experiments.gateway_calls [--requests 1000] [--top 25] [--stream]

CPU time on the shared 2-core VM moves 2x between runs; the number of Python calls a request makes does
not. Each server runs under cProfile twice, with `--warmup` and with `--warmup + --requests` closed-loop
requests (8 keep-alive connections, the load of bench/gateway_cpu.py), and the difference of the two
runs' call counts, divided by `--requests`, is the calls one request makes, startup and shutdown
cancelled out. Printed: both totals, fairserve's calls by package (C builtins apart), and its `--top`
functions by calls per request.
Results: docs/gateway.md, "Benchmark: gateway CPU against its floor".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pstats
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.gateway_cpu import PROMPT, Server

Key = tuple[str, int, str]


def profiled_run(name: str, args: list[str], requests: int, stream_tokens: int) -> pstats.Stats:
    """Start `args` under cProfile, drive `requests` requests, stop it with SIGINT, load its profile."""
    out = Path(tempfile.mkdtemp(prefix="gateway-calls-")) / "profile"
    server = Server(name, ["-m", "cProfile", "-o", str(out), *args])

    async def drive() -> None:
        model = "floor"
        if name == "fairserve":
            conn = await asyncio.open_connection(*server.addr)
            model = json.loads((await server.request(conn, server.raw("GET")))[1])["data"][0]["id"]
            conn[1].close()
        body: dict[str, Any] = {"model": model, "prompt": PROMPT, "ignore_eos": True, "max_tokens": 1}
        if stream_tokens:
            body.update(max_tokens=stream_tokens, stream=True)
        answered = await server.drive(body, requests, 8)
        if answered < requests:
            raise RuntimeError(f"{name}: {requests - answered} of {requests} requests failed")

    try:
        asyncio.run(drive())
    finally:
        server.proc.send_signal(signal.SIGINT)  # uvicorn re-raises SIGTERM, which would skip the dump
        server.proc.wait(60)
    return pstats.Stats(str(out))


def per_request(short: pstats.Stats, long: pstats.Stats, requests: int) -> dict[Key, float]:
    """Calls per request of every function, the short run's subtracted from the long one's."""
    before: dict[Key, int] = {k: v[1] for k, v in short.stats.items()}  # type: ignore[attr-defined]
    return {k: (v[1] - before.get(k, 0)) / requests for k, v in long.stats.items()}  # type: ignore[attr-defined]


def package(key: Key) -> str:
    """The package a function belongs to: its top-level folder, `builtins` for C, `stdlib` otherwise."""
    if key[0] == "~":
        return "builtins (C)"
    path = label(key).split(":", 1)[0]
    return path.split("/", 1)[0] if "/" in path and not path.startswith(("/", "<")) else "stdlib"


def label(key: Key) -> str:
    """A function's file (shortened to the package path), line and name."""
    path = key[0].split("site-packages/")[-1].replace(str(Path.cwd()) + "/", "")
    return f"{path}:{key[1]}({key[2]})"


def main(argv: list[str] | None = None) -> int:
    """Profile the floor and fairserve; print calls per request and fairserve's top functions."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--stream", action="store_true", help="16-token streams instead of max_tokens 1")
    args = p.parse_args(argv)
    tokens = 16 if args.stream else 0
    servers = {
        "floor": ["-m", "bench.gateway_floor"],
        "fairserve": ["-m", "gateway.cli", "serve", "--port", "0", "--data-dir"],
    }
    totals = {}
    for name, cmd in servers.items():
        runs = []
        for n in (args.warmup, args.warmup + args.requests):
            extra = [tempfile.mkdtemp(prefix="gateway-calls-data-")] if name == "fairserve" else []
            runs.append(profiled_run(name, cmd + extra, n, tokens))
        rows = per_request(runs[0], runs[1], args.requests)
        totals[name] = sum(rows.values())
        if name == "fairserve":
            top = sorted(rows.items(), key=lambda kv: -kv[1])[: args.top]
            packages: dict[str, float] = {}
            for key, calls in rows.items():
                packages[package(key)] = packages.get(package(key), 0.0) + calls
    kind = "16-token stream" if args.stream else "max_tokens 1"
    print(f"Python calls per request ({kind}, {args.requests} requests, cProfile):")
    print(
        f"  floor {totals['floor']:.0f}  fairserve {totals['fairserve']:.0f}  ratio {totals['fairserve'] / totals['floor']:.2f}"
    )
    print("fairserve's calls per request by package:")
    for name, calls in sorted(packages.items(), key=lambda kv: -kv[1]):
        if calls >= 0.5:  # what runs once at startup cancels out to zero
            print(f"  {calls:7.1f}  {name}")
    print("fairserve's most called functions, calls per request:")
    for key, calls in top:
        print(f"  {calls:7.1f}  {label(key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
