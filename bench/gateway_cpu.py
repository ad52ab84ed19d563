"""Gateway CPU per request against its own framework's floor, alternating rounds in one run.

    .venv/bin/python -m bench.gateway_cpu [--rounds 3] [--baseline ../main] [--profile DIR]

`fairserve serve` (its engine in its own process) and the floor (bench/gateway_floor.py), each round in
turn under the same closed-loop load: `max_tokens: 1`, 1-token streams, then `--stream-tokens`-token streams.
CPU is the server process's, every thread, from /proc, less its idle rate over the same wall time. Reported:
ms per request, the ratio to the floor (median of the rounds' ratios), and the marginal cost of a streamed
token: (a `--stream-tokens` stream - a 1-token stream) / (`--stream-tokens` - 1), issue 47's measure.

With `--waiting-floor 1` (the default) the *waiting floor* is measured in the same rounds too: the floor
paced as fairserve's engine paces fairserve (bench/gateway_floor.py `Ticker`: one shared timer ticking at
the engine's iteration time, each stream event waiting a tick, a reply as many ticks as fairserve's
requests took), both probed before the rounds. It says what the machine charges any server for answering after an idle wait, which the bare
floor, never idle under this load, does not pay; fairserve's ratio to it is reported beside the ratio
to the bare floor, which stays the target's measure. Method and results: docs/gateway.md, "Benchmark:
gateway CPU against its floor".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.banner import banner_entry
from bench.harness import parser

PROMPT = "The batch never waits."
KINDS = ("nonstream", "stream1", "stream")  # stream1: a 1-token stream, the base of the marginal token cost
RATIO_KINDS = ("nonstream", "stream")
RATIOS = ("nonstream_ratio", "stream_ratio")  # to the floor, in every row but its own
FLOORS = ("floor", "waiting_floor")


class Server:
    """A server subprocess (`fairserve serve` of some checkout, or the floor), its banner and its CPU."""

    def __init__(
        self, name: str, args: list[str], checkout: Path | None = None, until: str = "admin_token"
    ) -> None:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **({"PYTHONPATH": str(checkout)} if checkout else {})}
        self.name, self.banner = name, dict[str, str]()
        self.proc = subprocess.Popen(
            [sys.executable, *args], cwd=checkout, env=env, stdout=subprocess.PIPE, text=True
        )
        for line in self.proc.stdout or []:
            entry = banner_entry(line)  # a secret's file read into the secret (stdout is a pipe)
            self.banner.update([entry] if entry else [])
            if entry and entry[0] == until:  # the banner's last line
                break
        else:
            raise RuntimeError(f"{name} did not start")
        threading.Thread(target=lambda: [None for _ in self.proc.stdout or []], daemon=True).start()
        url = self.banner.get("url") or self.banner["engine"]  # an HTTP server's or a `fairserve engine`'s
        host, port = url.removeprefix("http://").removeprefix("tcp://").split(":")
        self.addr = (host, int(port))

    def cpu_s(self) -> float:
        """CPU seconds of the process's live threads (schedstat, ns), else utime + stime (clock ticks)."""
        try:
            tasks = Path(f"/proc/{self.proc.pid}/task").iterdir()
            return sum(int((t / "schedstat").read_text().split()[0]) for t in tasks) / 1e9
        except (OSError, ValueError):
            fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rpartition(")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    async def request(
        self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter], raw: bytes
    ) -> tuple[int, bytes]:
        """One HTTP/1.1 exchange on a keep-alive connection: status and body (Content-Length or chunked)."""
        reader, writer = conn
        writer.write(raw)
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").lower()
        if "content-length:" in head:
            size = int(head.split("content-length:", 1)[1].split("\r\n", 1)[0])
            return int(head.split(" ", 2)[1]), await reader.readexactly(size)
        parts = []
        while size := int((await reader.readuntil(b"\r\n"))[:-2], 16):
            parts.append((await reader.readexactly(size + 2))[:-2])
        await reader.readexactly(2)
        return int(head.split(" ", 2)[1]), b"".join(parts)

    def raw(self, method: str, body: dict[str, Any] | None = None) -> bytes:
        """A request's bytes: POST /v1/completions with `body`, or GET /v1/models."""
        data = b"" if body is None else json.dumps(body).encode()
        path = "/v1/models" if body is None else "/v1/completions"
        head = f"{method} {path} HTTP/1.1\r\nHost: {self.addr[0]}\r\nContent-Type: application/json\r\n"
        auth = f"Authorization: Bearer {self.banner['api_key']}\r\nContent-Length: {len(data)}\r\n\r\n"
        return (head + auth).encode() + data

    async def drive(self, body: dict[str, Any], n: int, concurrency: int) -> int:
        """`n` requests over `concurrency` connections, each waiting for its answer; how many got a 200."""
        raw, left, ok = self.raw("POST", body), [n], [0]

        async def client() -> None:
            conn = await asyncio.open_connection(*self.addr)
            while left[0] > 0:
                left[0] -= 1
                status = (await self.request(conn, raw))[0]  # awaited before `ok` is read
                ok[0] += status == 200
            conn[1].close()

        await asyncio.gather(*(client() for _ in range(concurrency)))
        return ok[0]

    async def measure(self, body: dict[str, Any], args: argparse.Namespace, profile: Path | None) -> float:
        """ms of CPU per answered request, less the idle rate over the same wall time."""
        await self.drive(body, args.concurrency * 4, args.concurrency)  # warm connections and batch shapes
        c0 = self.cpu_s()
        await asyncio.sleep(args.idle_s)
        idle_rate = (self.cpu_s() - c0) / args.idle_s
        spy = None if profile is None else subprocess.Popen(
            [str(Path(sys.executable).with_name("py-spy")), "record", "--pid", str(self.proc.pid), "--format", "raw", "--rate", "400", "--nonblocking", "-o", str(profile)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        await asyncio.sleep(0 if spy is None else 1.0)  # py-spy attaches
        c1, t1 = self.cpu_s(), time.perf_counter()
        ok = await self.drive(body, args.requests, args.concurrency)
        cpu, wall = self.cpu_s() - c1, time.perf_counter() - t1
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(30)
        if ok < args.requests:
            raise RuntimeError(f"{self.name}: {args.requests - ok} of {args.requests} requests failed")
        return float((cpu - idle_rate * wall) / args.requests * 1e3)

    def stop(self) -> None:
        """SIGTERM (the gateway drains and flushes its ledger), then wait."""
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


async def run(args: argparse.Namespace) -> dict[str, Any]:
    """Start the servers, alternate measured rounds, and summarise."""
    tmp = Path(tempfile.mkdtemp(prefix="gateway-cpu-"))
    serve = ["-m", "gateway.cli", "serve", "--port", "0", "--data-dir"]
    servers = [Server("floor", ["-m", "bench.gateway_floor"])]
    servers.append(Server("fairserve", [*serve, str(tmp / "this")]))
    if args.baseline:
        servers.append(Server("baseline", [*serve, str(tmp / "base")], Path(args.baseline).resolve()))
    samples: dict[str, dict[str, list[float]]] = {s.name: {k: [] for k in KINDS} for s in servers}
    try:
        conn = await asyncio.open_connection(*servers[1].addr)
        model = json.loads((await servers[1].request(conn, servers[1].raw("GET")))[1])["data"][0]["id"]
        conn[1].close()
        bodies = {
            "nonstream": {"max_tokens": 1},
            "stream1": {"max_tokens": 1, "stream": True},
            "stream": {"max_tokens": args.stream_tokens, "stream": True},
        }
        if args.waiting_floor:  # paced as fairserve's engine paced it: a tick per stream token
            probe = {"model": model, "prompt": PROMPT, "ignore_eos": True}
            reply_s, stream_s = [await _latency(servers[1], probe | bodies[k], args) for k in RATIO_KINDS]
            tick_ms = stream_s * 1e3 / args.stream_tokens
            reply_ticks = max(1, round(reply_s * 1e3 / tick_ms))
            report_waits = {"tick_ms": round(tick_ms, 2), "reply_ticks": reply_ticks}
            floor_args = ["-m", "bench.gateway_floor", "--tick-ms", f"{tick_ms:.3f}", "--reply-ticks", str(reply_ticks)]  # fmt: skip
            servers.insert(1, Server("waiting_floor", floor_args))
            samples["waiting_floor"] = {k: [] for k in KINDS}
        if args.profile:
            Path(args.profile).mkdir(parents=True, exist_ok=True)  # py-spy writes nothing into a missing one
        for r in range(args.rounds):
            for kind in KINDS:
                for s in servers if r % 2 == 0 else servers[::-1]:  # no server always measured first
                    body = {"model": model, "prompt": PROMPT, "ignore_eos": True, **bodies[kind]}
                    spy = Path(args.profile) / f"{s.name}-{kind}-{r}.txt" if args.profile else None
                    samples[s.name][kind].append(
                        await s.measure(body, args, None if s.name in FLOORS else spy)
                    )
    finally:
        for s in servers:
            s.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the servers' data directories
    report = summarise(samples, args)
    if "waiting_floor" in report:
        report["waiting_floor"].update(report_waits)
    return report


async def _latency(server: Server, body: dict[str, Any], args: argparse.Namespace) -> float:
    """Mean seconds a request takes on `server` under the benchmark's load (a short closed-loop probe)."""
    concurrency: int = args.concurrency
    n = concurrency * 8
    started = time.perf_counter()
    await server.drive(body, n, concurrency)
    return (time.perf_counter() - started) * concurrency / n


def summarise(samples: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> dict[str, Any]:
    """Median ms per request, median per-round ratio to the floor, and the per-token cost of a stream."""
    report: dict[str, Any] = {
        "rounds": args.rounds,
        "requests": args.requests,
        "concurrency": args.concurrency,
    }
    for name, kinds in samples.items():
        row = {f"{kind}_ms": statistics.median(values) for kind, values in kinds.items()}
        for kind in KINDS if name != "floor" else ():
            ratios = [v / f for v, f in zip(kinds[kind], samples["floor"][kind], strict=True)]
            row[f"{kind}_ratio"] = statistics.median(ratios)
            row[f"{kind}_ratio_min"], row[f"{kind}_ratio_max"] = min(ratios), max(ratios)
        for kind in KINDS if name not in FLOORS and "waiting_floor" in samples else ():
            waiting = zip(kinds[kind], samples["waiting_floor"][kind], strict=True)
            row[f"{kind}_ratio_waiting"] = statistics.median(v / f for v, f in waiting)
        steps = zip(kinds["stream"], kinds["stream1"], strict=True)
        row["per_token_ms"] = statistics.median((s - n) / (args.stream_tokens - 1) for s, n in steps)
        report[name] = {k: round(v, 4) for k, v in row.items()}
    if "baseline" in samples:  # this checkout over the other, round by round
        pairs = {k: zip(samples["fairserve"][k], samples["baseline"][k], strict=True) for k in KINDS}
        rounds = {k: [a / b for a, b in p] for k, p in pairs.items()}
        report["over_baseline"] = {k: round(statistics.median(r), 4) for k, r in rounds.items()}
        report["over_baseline_by_round"] = {k: [round(v, 3) for v in r] for k, r in rounds.items()}
    return report


def describe(report: dict[str, Any], stream_tokens: int) -> str:
    """The report as the few lines `make bench` prints."""
    lines = [f"gateway CPU per request, ms (median of {report['rounds']} alternating rounds)"]
    for name in ("floor", "waiting_floor", "fairserve", "baseline"):
        if (r := report.get(name)) is not None:
            spread = [f"{r[k]:.2f}x ({r[k + '_min']:.2f}-{r[k + '_max']:.2f})" for k in RATIOS if k in r]
            ratio = f"  vs floor {' / '.join(spread)}" if spread else ""
            if "nonstream_ratio_waiting" in r:
                ratio += f"  vs waiting floor {r['nonstream_ratio_waiting']:.2f}x / {r['stream_ratio_waiting']:.2f}x"
            lines.append(
                f"  {name:13} max_tokens=1 {r['nonstream_ms']:.3f}  {stream_tokens}-token stream {r['stream_ms']:.3f}"
                f"  per token {r['per_token_ms']:.4f}{ratio}"
            )
    if (w := report.get("waiting_floor")) is not None:
        lines.append(
            f"  (the waiting floor: a tick every {w['tick_ms']:.2f} ms, a stream event a tick, a reply {w['reply_ticks']})"
        )
    if "over_baseline" in report:
        b = report["over_baseline"]
        lines.append(
            f"  fairserve / baseline, round by round: {b['nonstream']:.3f} / {b['stream']:.3f} (medians)"
        )
        for kind, ratios in report["over_baseline_by_round"].items():
            lines.append(f"    {kind}: {' '.join(f'{r:.3f}' for r in ratios)}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, run, print the summary and the JSON report."""
    args = parser(
        __doc__,
        rounds=3,
        requests=(600, "measured requests per server, kind and round"),
        concurrency=(8, "keep-alive connections, each closed-loop"),
        stream_tokens=65,
        idle_s=(1.0, "idle CPU sampled before each measurement"),
        baseline=(None, "also measure `fairserve serve` from this checkout"),
        waiting_floor=(1, "1: also the floor that waits as long as fairserve's requests do; 0: not"),
        profile=(None, "DIR: py-spy stacks of each fairserve measurement"),
    ).parse_args(argv)
    import uvloop

    report = uvloop.run(run(args))
    print(describe(report, args.stream_tokens))
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
