"""What one iteration's outputs cost from the engine loop to the gateway, whole outputs vs deltas.

    .venv/bin/python -m experiments.diagnostics.report_wire

A whole RequestOutput carries the prompt, every token so far and the text so far: the engine copies
the tokens and text for it, the worker pickles all of it and the gateway's event loop unpickles it,
every iteration, for every running stream. The engine loop emits `OutputDelta` instead (new tokens
and text only) and the front rebuilds the totals. Both are measured here in the same run, the deltas
including that rebuild.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine.core.outputs import EngineStats, OutputDelta, RequestMetrics, RequestOutput
from engine.serving.boundary.messages import IterationReport
from engine.serving.boundary.route import OutputRoute

SHAPES = [
    (64, 16, 8),
    (1000, 128, 32),
    (4000, 512, 64),
    (256, 8000, 32),
]  # (prompt tokens, tokens so far, streams)


@dataclass
class WireCost:
    """Bytes and CPU for one report in one wire form."""

    bytes: int
    build_us: float  # the engine making the outputs from its requests
    send_us: float  # pickle in the worker
    receive_us: float  # unpickle (and, for deltas, rebuild) on the gateway's loop


@dataclass
class _Running:
    """What the engine holds for one running stream."""

    request_id: str
    prompt_token_ids: list[int]
    output_token_ids: list[int]
    text: str


def running(prompt: int, so_far: int, batch: int, rng: random.Random) -> list[_Running]:
    """`batch` streams with `prompt` tokens in and `so_far` out."""
    return [
        _Running(
            f"req-{i}",
            [rng.randrange(32000) for _ in range(prompt)],
            [rng.randrange(32000) for _ in range(so_far)],
            " tok" * so_far,
        )
        for i in range(batch)
    ]


def whole(streams: list[_Running], metrics: RequestMetrics) -> list[RequestOutput]:
    """One decode iteration's outputs as LLMEngine.step makes them: copies of the totals."""
    return [
        RequestOutput(
            r.request_id,
            r.prompt_token_ids,
            r.output_token_ids[-1:],
            list(r.output_token_ids),
            " tok",
            r.text[:],
            False,
            None,
            metrics,
        )
        for r in streams
    ]


def deltas(streams: list[_Running], metrics: RequestMetrics) -> list[OutputDelta]:
    """The same iteration as LLMEngine.step_deltas makes it."""
    return [OutputDelta(r.request_id, r.output_token_ids[-1:], " tok", False, None, metrics) for r in streams]


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def measure(prompt: int, so_far: int, batch: int, repeat: int = 30) -> dict[str, WireCost]:
    """The whole form (what crossed the pipe before) against deltas, the best of `repeat` timings each."""
    streams = running(prompt, so_far, batch, random.Random(prompt * 7 + batch))
    now = time.time()
    metrics = RequestMetrics(prompt, 0, so_far, float(prompt + so_far), 0, 0, 0, None, now, now, now, None)
    outs = whole(streams, metrics)
    stats = EngineStats()
    whole_wire = pickle.dumps((outs, stats), protocol=pickle.HIGHEST_PROTOCOL)
    report = IterationReport(deltas(streams, metrics), stats, [])
    delta_wire = pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
    loop = asyncio.new_event_loop()
    routes = {o.request_id: OutputRoute(loop, lambda _: None, o.prompt_token_ids) for o in outs}
    for o in outs:  # the front has seen every earlier token already
        routes[o.request_id].token_ids = list(o.token_ids[:-1])

    def receive_deltas() -> None:
        for d in pickle.loads(delta_wire).outputs:
            route = routes[d.request_id]
            route.expand(d)
            del route.token_ids[-1:]  # keep the route where it was for the next repeat

    try:
        return {
            "whole": WireCost(
                len(whole_wire),
                _best(lambda: whole(streams, metrics), repeat),
                _best(lambda: pickle.dumps((outs, stats), protocol=5), repeat),
                _best(lambda: pickle.loads(whole_wire), repeat),
            ),
            "delta": WireCost(
                len(delta_wire),
                _best(lambda: deltas(streams, metrics), repeat),
                _best(lambda: pickle.dumps(report, protocol=5), repeat),
                _best(receive_deltas, repeat),
            ),
        }
    finally:
        loop.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)
    rows = []
    for prompt, so_far, batch in SHAPES:
        cost = measure(prompt, so_far, batch)
        rows.append(
            {
                "prompt": prompt,
                "so_far": so_far,
                "batch": batch,
                **{f"{form}_{k}": round(v, 1) for form, c in cost.items() for k, v in c.__dict__.items()},
            }
        )
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print(
        "| prompt | tokens so far | batch | whole: bytes / build / send / receive "
        "| deltas: bytes / build / send / receive | engine ratio | gateway ratio |"
    )
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        engine = (r["whole_build_us"] + r["whole_send_us"]) / (r["delta_build_us"] + r["delta_send_us"])
        print(
            f"| {r['prompt']} | {r['so_far']} | {r['batch']} | {r['whole_bytes']:,} B / {r['whole_build_us']:.0f}"
            f" / {r['whole_send_us']:.0f} / {r['whole_receive_us']:.0f} us | {r['delta_bytes']:,} B / "
            f"{r['delta_build_us']:.0f} / {r['delta_send_us']:.0f} / {r['delta_receive_us']:.0f} us "
            f"| {engine:.1f}x | {r['whole_receive_us'] / r['delta_receive_us']:.1f}x |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
