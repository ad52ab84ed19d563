"""What a piece of the request path costs hot, and cold as a gateway runs it: after an idle wait.

    .venv/bin/python -m experiments.cold_code [--runs 200]

A gateway in front of an engine answers every request after a wait (the engine computes meanwhile), so
its code runs after the loop slept; a bare app under a closed loop never sleeps. Each piece is timed
(`time.thread_time_ns`, this thread's CPU) three ways: back to back (hot, the median of a tight loop),
right after a 2 ms sleep, and right after writing 16 MiB (every cache level evicted), the medians of
`--runs` single calls. Pieces: the built-in model's tokenizer on the benchmark's prompt, a completion
body's JSON with the standard library's encoder (what format.py used) and with msgspec's (what it uses),
and a msgspec decode of an 8-output engine report. Results: docs/gateway.md, "Where the CPU goes, in place".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import msgspec

from bench.gateway_cpu import PROMPT

_EVICT = bytearray(16 * 1024 * 1024)


def hot(fn: Callable[[], object], n: int = 5000) -> float:
    """µs a call, back to back."""
    started = time.thread_time_ns()
    for _ in range(n):
        fn()
    return (time.thread_time_ns() - started) / n / 1e3


def cold(fn: Callable[[], object], runs: int, evict: bool) -> float:
    """µs of one call right after a 2 ms sleep (or after evicting the caches), the median of `runs`."""
    spent = []
    for _ in range(runs):
        if evict:
            _EVICT[::64] = b"\1" * (len(_EVICT) // 64)
        else:
            time.sleep(0.002)
        started = time.thread_time_ns()
        fn()
        spent.append(time.thread_time_ns() - started)
    return statistics.median(spent) / 1e3


def pieces() -> dict[str, Callable[[], object]]:
    """The pieces timed, each a call with its inputs bound."""
    from engine import FinishReason
    from engine.core.outputs import OutputDelta, RequestMetrics
    from engine.core.tokenizer import Tokenizer
    from engine.serving.boundary.messages import FromEngineAsRead
    from engine.worker.loader import default_model_dir
    from gateway.openai.format import Shape

    tokenizer = Tokenizer.from_dir(default_model_dir())  # built on first use
    body: dict[str, Any] = {
        "id": "req-" + "0" * 32,
        "object": "text_completion",
        "created": 1_764_800_000,
        "model": "fairserve-tiny",
        "choices": [{"index": 0, "text": "x y z", "logprobs": None, "finish_reason": "length"}],
        "usage": {"prompt_tokens": 23, "completion_tokens": 1, "total_tokens": 24},
    }
    stdlib = json.JSONEncoder(ensure_ascii=False).encode
    fast = msgspec.json.Encoder().encode
    shape = Shape(False, "req-" + "0" * 32, "fairserve-tiny", 1_764_800_000)
    metrics = RequestMetrics(23, 0, 1, 24.0, 0, 0, 0, None, 0.0, 0.0, 0.0, 0.0)
    report = _report(OutputDelta, FinishReason, metrics)
    decoder = msgspec.msgpack.Decoder(FromEngineAsRead)
    return {
        "tokenizer encode (23 tokens)": lambda: tokenizer.encode(PROMPT),
        "completion body, stdlib json": lambda: stdlib(body),
        "completion body, msgspec": lambda: fast(body).decode(),
        "Shape.body (what a reply builds)": lambda: shape.body("x y z", FinishReason.LENGTH, metrics),
        "engine report decode (8 outputs)": lambda: decoder.decode(report),
    }


def _report(delta: Any, reason: Any, metrics: Any) -> bytes:
    """An encoded IterationReport of 8 finished outputs, as the worker sends one."""
    from engine.core.outputs import EngineStats
    from engine.serving.boundary.messages import IterationReport

    outputs = [delta(f"req-{i:032d}", [65], "A", True, reason.LENGTH, metrics) for i in range(8)]
    return msgspec.msgpack.encode(IterationReport(outputs, EngineStats(), []))


def main(argv: list[str] | None = None) -> int:
    """Time every piece three ways and print a table."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=200)
    args = p.parse_args(argv)
    print("| piece | hot, µs | after a 2 ms sleep | after evicting the caches |\n|---|---:|---:|---:|")
    for name, fn in pieces().items():
        fn()
        row = (hot(fn), cold(fn, args.runs, False), cold(fn, args.runs, True))
        print(f"| {name} | {row[0]:.1f} | {row[1]:.1f} | {row[2]:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
