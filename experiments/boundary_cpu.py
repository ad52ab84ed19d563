"""The engine boundary's CPU per request, alone: a ProcessEngine driven on uvloop with no HTTP in front.

    .venv/bin/python -m experiments.boundary_cpu                              # this checkout, 4 rounds
    .venv/bin/python -m experiments.boundary_cpu --baseline ../main           # alternating with another checkout

`--concurrency` closed-loop clients each `submit` a `max_tokens: 1` request (`--max-tokens`: more, each
token an output of its own as in a stream) with a sink (as the gateway does) and submit the next when it
finishes. CPU is this process's, every thread (ZeroMQ's I/O thread
included), from /proc (ns, schedstat), less its idle rate sampled for half a second before; the worker
process is not counted. What is left is the front (validate, register, encode, send; read, decode,
dispatch, hand over) and this driver's own few microseconds, the same on both sides of an A/B. With
`--baseline` each round runs this checkout and the other in turn (order swapped every round), each in a
fresh process with a fresh engine, and the ratio is taken round by round.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROMPT = "The batch never waits."


def threads_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name (summed over same-named ones)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{os.getpid()}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            out[name] = out.get(name, 0.0) + int((task / "schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError):
            continue  # a thread that ended meanwhile
    return out


async def measure(requests: int, concurrency: int, max_tokens: int = 1) -> dict[str, float]:
    """µs of CPU per request, in all and for ZeroMQ's I/O thread, after a warm-up of the same shape."""
    from engine import EngineConfig, ProcessEngine, RequestMeta, RequestOutput, SamplingParams

    engine = ProcessEngine(EngineConfig())
    engine.start()
    loop = asyncio.get_running_loop()
    prompt = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    ids, left = itertools.count(), [0]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            done: asyncio.Future[None] = loop.create_future()

            def sink(item: RequestOutput | BaseException, done: asyncio.Future[None] = done) -> None:
                if isinstance(item, BaseException):
                    done.set_exception(item)
                elif item.finished:
                    done.set_result(None)

            engine.submit(prompt, params, RequestMeta(tenant_id="t"), f"r{next(ids)}", sink)
            await done

    try:
        left[0] = concurrency * 10
        await asyncio.gather(*(client() for _ in range(concurrency)))
        c0 = sum(threads_cpu().values())
        await asyncio.sleep(0.5)
        idle_rate = (sum(threads_cpu().values()) - c0) / 0.5
        left[0], before, t0 = requests, threads_cpu(), time.perf_counter()
        await asyncio.gather(*(client() for _ in range(concurrency)))
        after, wall = threads_cpu(), time.perf_counter() - t0
    finally:
        engine.shutdown()
    spent = {name: cpu - before.get(name, 0.0) for name, cpu in after.items()}
    total = sum(spent.values()) - idle_rate * wall
    io = sum(v for k, v in spent.items() if k.startswith("ZMQbg/IO"))
    return {"us": total / requests * 1e6, "io_thread_us": io / requests * 1e6}


def one(checkout: Path, args: argparse.Namespace) -> dict[str, float]:
    """One measurement in a fresh process: this script, with `checkout`'s engine first on the path."""
    flags = ["--one", "--requests", str(args.requests), "--concurrency", str(args.concurrency)]
    flags += ["--max-tokens", str(args.max_tokens)]
    out = subprocess.run(
        [sys.executable, __file__, *flags],
        cwd=checkout,
        env={**os.environ, "PYTHONPATH": str(checkout)},
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    """Parse flags, alternate the rounds, print each and the medians."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--requests", type=int, default=800, help="measured requests per side and round")
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=1, help="tokens per request (ignore_eos)")
    p.add_argument("--baseline", default=None, help="also measure this other checkout, alternating")
    p.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a single measurement, as JSON
    args = p.parse_args(argv)
    if args.one:
        import uvloop

        print(json.dumps(uvloop.run(measure(args.requests, args.concurrency, args.max_tokens))))
        return 0
    sides = [("this", Path(__file__).resolve().parents[1])]
    if args.baseline:
        sides.append(("baseline", Path(args.baseline).resolve()))
    got: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    for r in range(args.rounds):
        for name, checkout in sides if r % 2 == 0 else sides[::-1]:
            got[name].append(one(checkout, args))
            print(f"round {r} {name:8} {got[name][-1]['us']:6.1f} us/request, "
                  f"ZeroMQ I/O thread {got[name][-1]['io_thread_us']:5.1f}", flush=True)  # fmt: skip
    for name, runs in got.items():
        print(f"{name:8} median {statistics.median(m['us'] for m in runs):6.1f} us/request, "
              f"I/O thread {statistics.median(m['io_thread_us'] for m in runs):5.1f}")  # fmt: skip
    if args.baseline:
        ratios = [a["us"] / b["us"] for a, b in zip(got["this"], got["baseline"], strict=True)]
        print("this / baseline, round by round:", " ".join(f"{x:.2f}" for x in ratios),
              f"(median {statistics.median(ratios):.2f})")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
