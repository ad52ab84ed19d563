"""Gateway overhead: latency added over calling the engine in-process, and rejection speed under overload.

    .venv/bin/python -m experiments.gateway_overhead --rate 200 --duration 5 --engine-process both

Runs the same open-loop request stream (fixed rate, max_tokens=1 and a short stream) once
against an in-process engine and once through `fairserve serve` (one uvicorn worker, a
subprocess with an identically configured engine), and reports p50/p99 of each and the
difference. Then saturates a small-queue gateway and measures how fast overload rejections
(503 `overloaded`) are answered. `--engine-process` picks the engine mode: `off` (the loop on a
thread of the gateway: AsyncEngine), `on` (the loop in its own process: ProcessEngine) or `both`,
measured one after the other in the same run and reported side by side.

    .venv/bin/python -m experiments.gateway_overhead --rate 100 --duration 3 --remote-ab 4

instead compares the local process engine with a `fairserve engine` reached over TCP, alternating them
round by round in one session (experiments/remote_ab.py; `--curve-ab` for the cluster key), and
`--trace-ab 4` tracing on (OTLP, ratio 1.0) against off (experiments/trace_ab.py).

Two overhead figures: *unpaired* is the literal comparison (gateway percentiles minus in-process
percentiles of separate runs), noisy because the engine's own latency varies between runs; *paired*
subtracts from each request's client latency the engine share the gateway reported for that same
request in `Server-Timing` (submit to last output, or to the first output for streams). The load
client is experiments/http1.py unless `--client httpx` (which adds ~2 ms of its own per request).

Latency on a small shared machine moves with whatever else runs on its cores; the gateway process's
CPU time per request (read from /proc over the same measured requests) moves much less, so it is
reported too, as the figure to compare two versions of the gateway by (alternating runs, still).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import uvloop

from bench.banner import banner_entry
from engine import AsyncEngine, EngineClient, EngineConfig, ProcessEngine, RequestMeta, SamplingParams
from experiments.http1 import Http1Pool

PROMPT = "The batch never waits."
NAN = float("nan")


def pct(values: list[float], q: float) -> float:
    """The q-quantile (0..1) of values, in the same unit."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))]


@dataclass
class Sample:
    """Latencies (seconds) of one run: to the first output and to the end."""

    first: list[float]
    total: list[float]
    refused: int = 0
    cpu_s: float = NAN  # CPU time the gateway process spent over the run, where measured

    def summary(self) -> dict[str, float]:
        """p50/p99 in milliseconds, and the gateway's CPU per request when measured."""
        return {
            "first_p50_ms": pct(self.first, 0.5) * 1e3,
            "first_p99_ms": pct(self.first, 0.99) * 1e3,
            "total_p50_ms": pct(self.total, 0.5) * 1e3,
            "total_p99_ms": pct(self.total, 0.99) * 1e3,
            "n": len(self.total),
            "refused": self.refused,
            "cpu_ms_per_request": self.cpu_s / max(1, len(self.total) + self.refused) * 1e3,
        }


async def open_loop(
    rate: float, n: int, one: Callable[[int], Coroutine[Any, Any, tuple[float, float]]]
) -> Sample:
    """Fire `n` calls at a fixed rate regardless of completions; collect their latencies."""
    start = time.perf_counter()
    tasks: list[asyncio.Task[tuple[float, float]]] = []
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.create_task(one(i)))
    results = [r for r in await asyncio.gather(*tasks) if r[1] == r[1]]  # NaN marks a refused request
    return Sample([r[0] for r in results], [r[1] for r in results], refused=n - len(results))


def warmup(rate: float) -> int:
    """Unmeasured requests first: two seconds of the same traffic. A fresh engine meets new batch shapes
    for a while (each first one costs torch tens of milliseconds), and those stalls are not the gateway's."""
    return max(50, int(rate * 2))


def engine_config(cache_dir: str, max_num_seqs: int) -> EngineConfig:
    """The engine configuration both sides use."""
    return EngineConfig(cache_dir=cache_dir, max_num_seqs=max_num_seqs)


async def in_process(
    cfg: EngineConfig, process: bool, rate: float, n: int, max_tokens: int, engine: EngineClient | None = None
) -> Sample:
    """Latency of the engine's generate called directly (`engine`, else one built from `cfg`), tokenising
    the prompt like the gateway does."""
    engine = engine or (ProcessEngine(cfg) if process else AsyncEngine(cfg))
    engine.start()
    try:

        async def one(i: int) -> tuple[float, float]:
            t0 = time.perf_counter()
            ids = engine.tokenizer.encode(PROMPT)
            first = None
            async for _out in engine.generate(
                ids,
                SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                RequestMeta(tenant_id="bench"),
                f"inproc-{max_tokens}-{i}",
            ):
                first = first or time.perf_counter() - t0
            return first or 0.0, time.perf_counter() - t0

        await open_loop(rate, warmup(rate), one)
        return await open_loop(rate, n, one)
    finally:
        engine.shutdown()


class Served:
    """`fairserve serve` in a subprocess; parses the banner for the URL and key."""

    def __init__(self, data_dir: str, *args: str) -> None:
        cmd = [sys.executable, "-m", "gateway.cli", "serve", "--port", "0", "--data-dir", data_dir, *args]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self.banner: dict[str, str] = {}
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            key, value = banner_entry(line) or ("", "")  # a secret's file read into the secret
            if key in ("url", "api_key", "admin_token"):
                self.banner[key] = value
            if key == "admin_token":
                break
        if "admin_token" not in self.banner:
            raise RuntimeError("fairserve serve did not start")
        # Keep draining output so the child never blocks on a full pipe.
        threading.Thread(target=lambda: [None for _ in self.proc.stdout or []], daemon=True).start()
        self.url = self.banner["url"]
        self.headers = {"Authorization": f"Bearer {self.banner['api_key']}"}

    def cpu_s(self) -> float:
        """CPU seconds (user and system, every thread) the gateway process has used so far: with the engine
        in its own process that is the gateway alone, with the engine on a thread it includes the engine
        loop. NaN where /proc is missing."""
        try:
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            return NAN
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime

    def stop(self) -> None:
        """SIGTERM and wait."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class Poster:
    """POSTs through one HTTP client kind; see `post` for what comes back."""

    def __init__(self, served: Served, kind: str) -> None:
        self.kind = kind
        self.pool = Http1Pool(served.url, served.headers)
        limits = httpx.Limits(max_connections=2000, max_keepalive_connections=2000)
        self.httpx = httpx.AsyncClient(
            base_url=served.url, headers=served.headers, timeout=300, limits=limits
        )

    async def post(
        self,
        path: str,
        body: dict[str, Any],
        headers: dict[str, str] | None = None,
    ) -> tuple[int, float | None, float, float]:
        """Status, the engine's share in seconds (the gateway's `Server-Timing`), seconds to the first SSE
        event and to the end."""
        t0 = time.perf_counter()
        if self.kind == "http1":
            reply = await self.pool.request("POST", path, body, headers, marker=b"data: {")
            end = time.perf_counter()
            return (
                reply.status,
                engine_share(reply.headers.get("server-timing")),
                (reply.marked_at or end) - t0,
                end - t0,
            )
        first = None
        async with self.httpx.stream("POST", path, json=body, headers=headers) as resp:
            async for line in resp.aiter_lines():
                if first is None and line.startswith("data: {"):
                    first = time.perf_counter()
        end = time.perf_counter()
        return (
            resp.status_code,
            engine_share(resp.headers.get("server-timing")),
            (first or end) - t0,
            end - t0,
        )

    async def close(self) -> None:
        await self.pool.close()
        await self.httpx.aclose()


def engine_share(server_timing: str | None) -> float | None:
    """Seconds from the first `dur=` of a Server-Timing header, if any."""
    for part in (server_timing or "").split(";"):
        name, _, value = part.strip().partition("=")
        if name == "dur":
            return float(value) / 1e3
    return None


async def through_gateway(
    poster: Poster,
    served: Served,
    model: str,
    rate: float,
    n: int,
    max_tokens: int,
    stream: bool,
    paired: list[float],
) -> Sample:
    """Latency of the same requests over HTTP through the gateway. `paired` gets, per request, the client's
    latency (to the first event for streams) minus the engine's share the gateway reported for it: what the
    gateway and the network added to that very request, free of the engine's own load noise."""
    body = {"model": model, "prompt": PROMPT, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}

    async def one(i: int) -> tuple[float, float]:
        status, engine_s, first, total = await poster.post("/v1/completions", body)
        if status != 200:
            return NAN, NAN
        if engine_s is not None:
            paired.append((first if stream else total) - engine_s)
        return first, total

    await poster.pool.prewarm(32)  # a load generator opens its connections before it measures
    await open_loop(rate, warmup(rate), one)
    paired.clear()  # warm-up requests are not measured
    cpu = served.cpu_s()
    sample = await open_loop(rate, n, one)
    sample.cpu_s = served.cpu_s() - cpu
    return sample


def paired_summary(paired: list[float]) -> dict[str, float]:
    """p50/p99 in milliseconds of per-request gateway overheads."""
    return {"n": len(paired), "p50_ms": pct(paired, 0.5) * 1e3, "p99_ms": pct(paired, 0.99) * 1e3}


async def rejections(poster: Poster, model: str, rate: float, n: int, hogs: int) -> dict[str, float]:
    """Saturate the engine and the queue, then measure how quickly overload rejections come back."""
    hog_body = {"model": model, "prompt": PROMPT, "max_tokens": 1500, "ignore_eos": True}
    await poster.pool.prewarm(32)
    fillers = []
    for _ in range(hogs):  # spaced so each is admitted: every slot busy, then the queue full
        fillers.append(
            asyncio.create_task(poster.post("/v1/completions", hog_body, {"X-Task-Id": "bench-hogs"}))
        )
        await asyncio.sleep(0.3)
    statuses: list[int] = []

    async def one(i: int) -> tuple[float, float]:
        status, _, _, elapsed = await poster.post("/v1/completions", {**hog_body, "max_tokens": 1})
        statuses.append(status)
        return elapsed, elapsed

    t0 = time.perf_counter()
    sample = await open_loop(rate, n, one)
    wall = time.perf_counter() - t0
    await poster.post("/v1/tasks/bench-hogs/cancel", {})
    await asyncio.gather(*fillers, return_exceptions=True)
    rejected = [s for s in statuses if s in (429, 503)]
    return {
        "rejected": len(rejected),
        "sent": n,
        "rejected_per_s": len(rejected) / wall,
        "p50_ms": pct(sample.total, 0.5) * 1e3,
        "p99_ms": pct(sample.total, 0.99) * 1e3,
    }


async def measure_mode(args: argparse.Namespace, tmp: str, process: bool) -> dict[str, object]:
    """Every measurement for one engine mode: in-process, through the gateway, paired, overload."""
    n = int(args.rate * args.duration)
    mode = "process" if process else "thread"
    flag = "--engine-process" if process else "--no-engine-process"
    report: dict[str, object] = {}
    cfg = engine_config(str(Path(tmp) / "models"), args.max_num_seqs)
    report["inproc_nonstream"] = (await in_process(cfg, process, args.rate, n, 1)).summary()
    report["inproc_stream"] = (await in_process(cfg, process, args.rate, n, args.stream_tokens)).summary()
    served = Served(str(Path(tmp) / f"{mode}-a"), "--max-num-seqs", str(args.max_num_seqs), flag)
    paired_n: list[float] = []
    paired_s: list[float] = []
    poster = Poster(served, args.client)
    try:
        model = (await poster.pool.request("GET", "/v1/models")).json()["data"][0]["id"]
        report["gateway_nonstream"] = (
            await through_gateway(poster, served, model, args.rate, n, 1, False, paired_n)
        ).summary()
        report["gateway_stream"] = (
            await through_gateway(poster, served, model, args.rate, n, args.stream_tokens, True, paired_s)
        ).summary()
    finally:
        await poster.close()
        served.stop()  # SIGTERM flushes the ledger
    report["paired_overhead_nonstream"] = paired_summary(paired_n)
    report["paired_overhead_stream_first"] = paired_summary(paired_s)
    small = Served(str(Path(tmp) / f"{mode}-b"), "--max-num-seqs", "4", "--max-queued-requests", "4", flag)
    poster = Poster(small, args.client)
    try:
        report["overload"] = await rejections(
            poster, model, args.reject_rate, int(args.reject_rate * 2), 4 + 4
        )
    finally:
        await poster.close()
        small.stop()
    for kind in ("nonstream", "stream"):
        g, e = report[f"gateway_{kind}"], report[f"inproc_{kind}"]
        assert isinstance(g, dict) and isinstance(e, dict)
        report[f"overhead_{kind}"] = {
            k: g[k] - e[k] for k in ("first_p50_ms", "first_p99_ms", "total_p50_ms", "total_p99_ms")
        }
    return report


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    if args.trace_ab:
        from experiments.trace_ab import trace_ab  # deferred: it builds on this module

        return await trace_ab(args)
    if args.remote_ab or args.curve_ab:
        from experiments.remote_ab import curve_ab, remote_ab  # deferred: it builds on this module

        return await (curve_ab(args) if args.curve_ab else remote_ab(args))
    report: dict[str, object] = {
        "rate": args.rate,
        "requests": int(args.rate * args.duration),
        "client": args.client,
    }
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.engine_process]
    with tempfile.TemporaryDirectory() as tmp:
        for process in modes:
            report["process" if process else "thread"] = await measure_mode(args, tmp, process)
    return report


def side_by_side(report: dict[str, object]) -> str:
    """A Markdown table of the headline figures, one column pair per measured engine mode."""
    measured: dict[str, dict[str, Any]] = {
        m: v for m in ("thread", "process") if isinstance(v := report.get(m), dict)
    }
    rows = [
        ("in-process, max_tokens=1", "inproc_nonstream", "total_"),
        ("gateway, max_tokens=1", "gateway_nonstream", "total_"),
        ("unpaired overhead, non-streaming", "overhead_nonstream", "total_"),
        ("unpaired overhead, stream first token", "overhead_stream", "first_"),
        ("unpaired overhead, whole stream", "overhead_stream", "total_"),
        ("paired overhead, non-streaming", "paired_overhead_nonstream", ""),
        ("paired overhead, stream first token", "paired_overhead_stream_first", ""),
    ]
    head = (
        f"| {report['rate']:g} req/s, {report['requests']} requests | "
        + " | ".join(f"{m} p50 | {m} p99" for m in measured)
        + " |"
    )
    lines = [head, "|---" * (1 + 2 * len(measured)) + "|"]
    for label, key, which in rows:
        cells = [f"{r[key][f'{which}{q}_ms']:.2f} ms" for r in measured.values() for q in ("p50", "p99")]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    cells = [f"{r['overload'][f'{q}_ms']:.2f} ms" for r in measured.values() for q in ("p50", "p99")]
    refused = "; ".join(
        f"{m}: {r['overload']['rejected']}/{r['overload']['sent']} refused at "
        f"{r['overload']['rejected_per_s']:.0f} /s"
        for m, r in measured.items()
    )
    lines.append(f"| overload rejections ({refused}) | " + " | ".join(cells) + " |")
    queued_out = ", ".join(
        f"{m}: {r['gateway_nonstream']['refused']} / {r['gateway_stream']['refused']}"
        for m, r in measured.items()
    )
    cpu = ", ".join(
        f"{m}: {r['gateway_nonstream']['cpu_ms_per_request']:.3f} / "
        f"{r['gateway_stream']['cpu_ms_per_request']:.3f} ms"
        for m, r in measured.items()
    )
    return "\n".join(lines) + (
        f"\n\nrequests the gateway refused (non-streaming / streaming): {queued_out}\n"
        f"gateway process CPU per request (non-streaming / streaming): {cpu}\n"
    )


def main() -> None:
    """Parse flags, run, print JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rate", type=float, default=200.0, help="requests per second, open loop")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of traffic per measurement")
    p.add_argument("--stream-tokens", type=int, default=8)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--reject-rate", type=float, default=500.0, help="offered rate during overload")
    p.add_argument(
        "--engine-process",
        choices=["off", "on", "both"],
        default="both",
        help="engine loop on a gateway thread (off), in its own process (on), or measure both",
    )
    p.add_argument(
        "--client",
        choices=["http1", "httpx"],
        default="http1",
        help="load client: a minimal keep-alive HTTP/1.1 client, or httpx (about 2 ms of its own per request)",
    )
    p.add_argument(
        "--remote-ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: alternate the local process engine and a `fairserve engine` over TCP",
    )
    p.add_argument(
        "--curve-ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: alternate a `fairserve engine` with --cluster-key (CurveZMQ) and one without",
    )
    p.add_argument(
        "--trace-ab",
        type=int,
        default=0,
        metavar="ROUNDS",
        help="instead: alternate tracing on (OTLP to a local sink, ratio 1.0) and off (experiments/trace_ab.py)",
    )
    args = p.parse_args()
    report = uvloop.run(main_async(args))  # the loop uvicorn uses too: the client's own cost stays small
    print(json.dumps(_rounded(report), indent=2))
    if not args.remote_ab and not args.curve_ab and not args.trace_ab:
        print(side_by_side(report))


def _rounded(value: object) -> object:
    if isinstance(value, float):
        return round(value, 3)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


if __name__ == "__main__":
    main()
