"""How long handing a request to an idle engine worker holds the event loop, by the worker's CPU policy.

    .venv/bin/python -m bench.diagnostics.submit_wake --rate 20 --seconds 8 --rounds 2

`ProcessEngine.submit` writes the request into the worker's pipe on the event loop. When the worker
sleeps waiting for work, that write wakes it, and Linux may run the woken worker on the writer's own
CPU at once: the event loop is then frozen, inside its write, for a whole engine iteration. This
times `submit` itself (wall clock) at a low, fixed request rate, with the
worker under the normal policy and under SCHED_BATCH (`EngineConfig.worker_batch_scheduling`), which
makes a woken task wait for the running one to yield. Modes alternate within one run.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
import time

import uvloop

from bench.diagnostics.jitter import pct
from engine import EngineConfig, ProcessEngine, RequestMeta, SamplingParams
from engine.boundary.front import OutputStream

PROMPT = "The batch never waits."


async def _timed_submits(engine: ProcessEngine, rate: float, n: int, tag: str) -> list[float]:
    """Wall-clock seconds of each of `n` submits sent at `rate`, after each has finished."""
    ids = engine.tokenizer.encode(PROMPT)
    params = SamplingParams(max_tokens=1, ignore_eos=True, stream_outputs=False)
    out: list[float] = []
    readers: list[asyncio.Task[None]] = []

    async def drain(stream: OutputStream) -> None:
        async for _ in stream:
            pass

    start = time.perf_counter()
    for i in range(n):
        delay = start + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        began = time.perf_counter()
        stream = engine.submit(ids, params, RequestMeta(tenant_id="bench"), f"{tag}-{i}")
        out.append(time.perf_counter() - began)
        readers.append(asyncio.create_task(drain(stream)))
    await asyncio.gather(*readers)
    return out


def _policy(pid: int) -> str:
    names = {getattr(os, n): n for n in ("SCHED_OTHER", "SCHED_BATCH", "SCHED_IDLE") if hasattr(os, n)}
    return names.get(os.sched_getscheduler(pid), "other") if hasattr(os, "sched_getscheduler") else "unknown"


def measure(rate: float, seconds: float, rounds: int) -> dict[str, dict[str, object]]:
    """Submit wall-clock percentiles (us) per worker policy, and the policy the worker really ran under."""
    samples: dict[str, list[float]] = {"normal": [], "batch": []}
    policies: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(rounds):
            for mode in samples:
                engine = ProcessEngine(EngineConfig(cache_dir=tmp, worker_batch_scheduling=mode == "batch"))
                engine.start()
                try:
                    assert engine._proc is not None and engine._proc.pid is not None
                    policies[mode] = _policy(engine._proc.pid)
                    warm = max(5, int(rate))  # the first iterations meet new shapes; not measured
                    uvloop.run(_timed_submits(engine, rate, warm, f"warm{r}"))
                    samples[mode] += uvloop.run(_timed_submits(engine, rate, int(rate * seconds), f"m{r}"))
                finally:
                    engine.shutdown()
    report: dict[str, dict[str, object]] = {}
    for mode, walls in samples.items():
        report[mode] = {
            "worker_policy": policies[mode],
            "n": len(walls),
            **{
                f"{name}_us": round(pct(walls, q) * 1e6, 1)
                for name, q in (("p50", 0.5), ("p90", 0.9), ("p99", 0.99))
            },
            "max_us": round(max(walls) * 1e6, 1),
        }
    return report


def main() -> None:
    """Parse flags, run, print JSON."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--rate", type=float, default=20.0, help="submits per second (low: the worker sleeps between)"
    )
    p.add_argument("--seconds", type=float, default=8.0, help="measured seconds per mode and round")
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    print(json.dumps(measure(args.rate, args.seconds, args.rounds), indent=2))


if __name__ == "__main__":
    main()
