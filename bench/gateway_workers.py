"""Tokens/s streamed and gateway cores used by `fairserve serve --workers 1` and `--workers 2`, in front of one
`fairserve engine` running a 1-layer model, the fastest engine this machine runs (issue 47, point 4).

    .venv/bin/python -m bench.gateway_workers [--rounds 3] [--seconds 8] [--concurrency 32] [--stream-tokens 64]

One engine process (bench/small_models.py `one_layer_config`: one layer, 32 wide, the byte tokenizer) and
two gateways attached to it, one of each worker count, both with Redis (`--workers 2` needs it; the lone
worker gets it too, so the two differ only in their worker count). Each round drives one gateway and then
the other (the order reversed every other round): `--concurrency` keep-alive connections, each streaming
`--stream-tokens`-token completions (`ignore_eos`, `stream_options.include_usage`) back to back for
`--seconds`. Tokens are the usage events' `completion_tokens`; CPU is read from /proc for each process
tree (the gateway's supervisor and its workers, the engine and its worker), less its idle rate sampled for a
second before. Reported per worker count, medians of the rounds: tokens/s, gateway cores (CPU s / wall s),
µs of gateway CPU per token, engine cores and the load client's own cores; and 2 workers over 1, round by
round. On a host whose cores the engine, the client and the gateways share, the client and the engine bound
tokens/s as much as the gateway does: read the cores columns beside it. Results: docs/gateway.md, "Several
workers: tokens/s and cores".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.gateway_cpu import PROMPT, Server
from bench.harness import parser
from bench.small_models import one_layer_config

COUNTS = (1, 2)  # gateway workers compared
_TOKENS = re.compile(rb'"usage":\{"prompt_tokens":\d+,"completion_tokens":(\d+)')
_END = b"0\r\n\r\n"  # the last chunk of a chunked body


def tree_cpu_s(pid: int) -> float:
    """CPU seconds (user + system, every thread) of `pid` and every process below it, from /proc."""
    total, todo, tick = 0.0, [pid], 100.0
    while todo:
        p = todo.pop()
        try:
            fields = Path(f"/proc/{p}/stat").read_text().rpartition(")")[2].split()
            total += (int(fields[11]) + int(fields[12])) / tick
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue  # it ended meanwhile
    return total


async def stream_tokens(conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], raw: bytes) -> int:
    """One streamed completion on a keep-alive connection: the completion tokens its usage event names (0
    for an error). The body is read in bulk, not event by event, so the client costs little per token."""
    reader, writer = conn
    writer.write(raw)
    head = await reader.readuntil(b"\r\n\r\n")
    data = b""
    while not data.endswith(_END):
        more = await reader.read(1 << 16)
        if not more:
            raise ConnectionError("the gateway closed the connection mid-stream")
        data += more
    found = _TOKENS.findall(data)
    return int(found[-1]) if head.startswith(b"HTTP/1.1 200") and found else 0


async def drive(server: Server, body: dict[str, Any], concurrency: int, seconds: float) -> tuple[int, int]:
    """Closed-loop streams for `seconds` over `concurrency` connections: (completed requests, tokens)."""
    raw, until, done = server.raw("POST", body), time.monotonic() + seconds, [0, 0]

    async def client() -> None:
        conn = await asyncio.open_connection(*server.addr)
        while time.monotonic() < until:
            tokens = await stream_tokens(conn, raw)
            done[0], done[1] = done[0] + 1, done[1] + tokens
        conn[1].close()

    await asyncio.gather(*(client() for _ in range(concurrency)))
    return done[0], done[1]


async def measure(
    server: Server, engine: Server, body: dict[str, Any], args: argparse.Namespace
) -> dict[str, float]:
    """One gateway's round: tokens/s, its cores and the engine's (each less its idle rate), the client's."""
    await drive(server, body, args.concurrency, 1.0)  # warm connections, workers and batch shapes
    pids = {"gateway": server.proc.pid, "engine": engine.proc.pid}
    idle0 = {k: tree_cpu_s(p) for k, p in pids.items()}
    await asyncio.sleep(1.0)
    idle = {k: tree_cpu_s(p) - idle0[k] for k, p in pids.items()}  # per second
    cpu0, client0, t0 = {k: tree_cpu_s(p) for k, p in pids.items()}, time.process_time(), time.perf_counter()
    requests, tokens = await drive(server, body, args.concurrency, args.seconds)
    wall = time.perf_counter() - t0
    cores = {k: (tree_cpu_s(p) - cpu0[k] - idle[k] * wall) / wall for k, p in pids.items()}
    if tokens < requests * args.stream_tokens:
        raise RuntimeError(
            f"{server.name}: {requests} streams brought {tokens} tokens, not {args.stream_tokens} each"
        )
    return {
        "tokens_per_s": tokens / wall,
        "gateway_cores": cores["gateway"],
        "gateway_us_per_token": cores["gateway"] * wall / tokens * 1e6,
        "engine_cores": cores["engine"],
        "client_cores": (time.process_time() - client0) / wall,
    }


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the engine and both gateways, alternate the rounds, summarise."""
    from engine.worker.loader import write_seeded_llama

    tmp = Path(tempfile.mkdtemp(prefix="gateway-workers-"))
    write_seeded_llama(tmp / "model", one_layer_config())
    seats = str(max(args.concurrency, 8))
    engine = Server(
        "engine",
        ["-m", "gateway.cli", "engine", "--listen", "tcp://127.0.0.1:0", "--data-dir", str(tmp / "engine"),
         "--model", str(tmp / "model"), "--max-num-seqs", seats, "--num-kv-blocks", str(args.concurrency * 12 + 64)],
        until="engine_id",
    )  # fmt: skip
    servers: dict[int, Server] = {}
    samples: dict[int, list[dict[str, float]]] = {n: [] for n in COUNTS}
    try:
        for n in COUNTS:
            serve = ["-m", "gateway.cli", "serve", "--port", "0", "--data-dir", str(tmp / f"gateway-{n}")]
            serve += ["--workers", str(n), "--redis", args.redis, "--engine", f"tcp://{engine.addr[0]}:{engine.addr[1]}"]  # fmt: skip
            servers[n] = Server(f"workers-{n}", serve)
        first = servers[COUNTS[0]]
        conn = await asyncio.open_connection(*first.addr)
        model = json.loads((await first.request(conn, first.raw("GET")))[1])["data"][0]["id"]
        conn[1].close()
        body = {
            "model": model,
            "prompt": PROMPT,
            "max_tokens": args.stream_tokens,
            "ignore_eos": True,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        for r in range(args.rounds):
            for n in COUNTS if r % 2 == 0 else COUNTS[::-1]:
                samples[n].append(await measure(servers[n], engine, body, args))
    finally:
        for server in [*servers.values(), engine]:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    return summarise(samples, args)


def summarise(samples: dict[int, list[dict[str, float]]], args: argparse.Namespace) -> dict[str, Any]:
    """Medians per worker count, with each figure's range, and 2 workers over 1 round by round."""
    report: dict[str, Any] = {
        "rounds": args.rounds,
        "seconds": args.seconds,
        "concurrency": args.concurrency,
        "stream_tokens": args.stream_tokens,
    }
    for n, rounds in samples.items():
        row: dict[str, Any] = {}
        for key in rounds[0]:
            values = [s[key] for s in rounds]
            row[key] = round(statistics.median(values), 3)
            row[f"{key}_range"] = [round(min(values), 3), round(max(values), 3)]
        report[f"workers_{n}"] = row
    by_round = [b["tokens_per_s"] / a["tokens_per_s"] for a, b in zip(samples[1], samples[2], strict=True)]
    report["tokens_per_s_2_over_1"] = [round(v, 3) for v in by_round]
    return report


def describe(report: dict[str, Any]) -> str:
    """The report as a few lines."""
    lines = [
        f"{report['stream_tokens']}-token streams over {report['concurrency']} connections, "
        f"{report['seconds']} s a round (median of {report['rounds']} alternating rounds, range in brackets)"
    ]
    for n in COUNTS:
        r = report[f"workers_{n}"]
        cells = [
            f"{r[k]:{fmt}} ({r[k + '_range'][0]:{fmt}}-{r[k + '_range'][1]:{fmt}}) {label}"
            for k, fmt, label in (
                ("tokens_per_s", ".0f", "tokens/s"),
                ("gateway_cores", ".2f", "gateway cores"),
                ("gateway_us_per_token", ".1f", "µs gateway CPU/token"),
                ("engine_cores", ".2f", "engine cores"),
                ("client_cores", ".2f", "client cores"),
            )
        ]
        lines.append(f"  --workers {n}: " + ", ".join(cells))
    lines.append(
        "  tokens/s, 2 workers / 1, by round: "
        + " ".join(f"{v:.3f}" for v in report["tokens_per_s_2_over_1"])
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print the summary and the JSON report."""
    args = parser(
        __doc__,
        rounds=3,
        seconds=(8.0, "measured seconds per gateway and round"),
        concurrency=(32, "keep-alive connections, each streaming closed-loop"),
        stream_tokens=64,
        redis=("redis://127.0.0.1:6379/14", "Redis URL both gateways use (--workers 2 needs one)"),
    ).parse_args(argv)
    import uvloop

    report = uvloop.run(run(args))
    print(describe(report))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
