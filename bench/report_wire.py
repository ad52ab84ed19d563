"""What one iteration's report costs to send from the engine worker to the gateway, whole outputs vs deltas.

    .venv/bin/python -m bench.report_wire

In process mode every iteration's outputs are pickled in the worker and unpickled on the gateway's
event loop. A whole RequestOutput carries the prompt, every token so far and the text so far, so a
report grows with context x batch. The wire form is `OutputDelta` (new tokens and text only); the
front rebuilds the totals. Both are measured here in the same run, the deltas including that rebuild.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import pickle
import random
import time
from dataclasses import dataclass

from engine.front import OutputRoute
from engine.messages import IterationReport, OutputDelta
from engine.outputs import EngineStats, RequestMetrics, RequestOutput

SHAPES = [(64, 16, 8), (1000, 128, 32), (4000, 512, 64)]  # (prompt tokens, tokens so far, streams in the batch)


@dataclass
class WireCost:
    """Bytes and CPU for one report in one wire form."""

    bytes: int
    send_us: float  # pickle in the worker
    receive_us: float  # unpickle (and, for deltas, rebuild) on the gateway's loop


def outputs(prompt: int, so_far: int, batch: int, rng: random.Random) -> list[RequestOutput]:
    """One decode iteration's outputs: every stream got one token."""
    now = time.time()
    metrics = RequestMetrics(prompt, 0, so_far, float(prompt + so_far), 0, 0, 0, None, now, now, now, None)
    outs = []
    for i in range(batch):
        ids = [rng.randrange(32000) for _ in range(so_far)]
        outs.append(RequestOutput(f"req-{i}", [rng.randrange(32000) for _ in range(prompt)], ids[-1:], ids,
                                  " tok", " tok" * so_far, False, None, metrics))
    return outs


def _best(fn: object, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()  # type: ignore[operator]
        best = min(best, time.perf_counter() - t)
    return best * 1e6


def measure(prompt: int, so_far: int, batch: int, repeat: int = 30) -> dict[str, WireCost]:
    """The whole form (what crossed the pipe before) against deltas, the best of `repeat` timings each."""
    outs = outputs(prompt, so_far, batch, random.Random(prompt * 7 + batch))
    stats = EngineStats()
    whole = pickle.dumps((outs, stats), protocol=pickle.HIGHEST_PROTOCOL)
    report = IterationReport([OutputDelta.of(o) for o in outs], stats, [])
    deltas = pickle.dumps(report, protocol=pickle.HIGHEST_PROTOCOL)
    loop = asyncio.new_event_loop()
    routes = {o.request_id: OutputRoute(loop, asyncio.Queue(), o.prompt_token_ids) for o in outs}
    for o in outs:  # the front has seen every earlier token already
        routes[o.request_id].token_ids = list(o.token_ids[:-1])

    def receive_deltas() -> None:
        for d in pickle.loads(deltas).outputs:
            route = routes[d.request_id]
            route.expand(d)
            del route.token_ids[-1:]  # keep the route where it was for the next repeat

    try:
        return {
            "whole": WireCost(len(whole), _best(lambda: pickle.dumps((outs, stats), protocol=5), repeat),
                              _best(lambda: pickle.loads(whole), repeat)),
            "delta": WireCost(len(deltas), _best(lambda: pickle.dumps(report, protocol=5), repeat),
                              _best(receive_deltas, repeat)),
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
        rows.append({"prompt": prompt, "so_far": so_far, "batch": batch,
                     **{f"{form}_{k}": round(v, 1) for form, c in cost.items() for k, v in c.__dict__.items()}})
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    print("| prompt | tokens so far | batch | whole: bytes / send / receive | deltas: bytes / send / receive |"
          " receive ratio |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt']} | {r['so_far']} | {r['batch']} "
              f"| {r['whole_bytes']:,} B / {r['whole_send_us']:.0f} us / {r['whole_receive_us']:.0f} us "
              f"| {r['delta_bytes']:,} B / {r['delta_send_us']:.0f} us / {r['delta_receive_us']:.0f} us "
              f"| {r['whole_receive_us'] / r['delta_receive_us']:.1f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
