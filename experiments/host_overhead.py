"""The engine loop's own cost: host microseconds per request per decode step, per phase, beside the forward.

    python -m experiments.host_overhead                    # batches 64, 256, 1024; markdown table on stdout
    python -m experiments.host_overhead --json out.json    # also the raw figures
    python -m experiments.host_overhead --async-ab         # also step time with async scheduling off / on, alternated

A 1-layer, 32-wide seeded Llama (byte tokenizer) keeps the forward small, so what the engine does
around it shows. Every request is admitted, prefilled, and then the engine is stepped in decode steady
state (every running request decodes one token, nothing else happens); the split is read from the
engine's own IterationTrace rows, the same figures a deployment writes with `trace_path`. The
front's share (rebuilding each output's totals and detokenizing what the loop leaves to it) is
timed separately, on the same outputs, with the front's own code (engine/serving/boundary/route.py `OutputRoute`),
and so is "publish": the stats snapshot and the encoded IterationReport that the loop sends the front
under ProcessEngine after every step (engine/serving/boundary/worker.py): msgspec, as the default ZeroMQ transport
encodes it (engine/serving/boundary/zmq_channel.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
import torch

from bench.small_models import one_layer_config
from engine.config import EngineConfig
from engine.core.outputs import text_in_loop
from engine.core.sampling_params import SamplingParams
from engine.serving.boundary.messages import IterationReport
from engine.serving.boundary.route import OutputRoute
from engine.serving.llm_engine import LLMEngine
from engine.worker.loader import write_seeded_llama

_ENCODE = msgspec.msgpack.Encoder().encode

PHASES = ("schedule", "prepare", "sample", "update", "outputs")
PROMPT_TOKENS = 16


@dataclass
class Row:
    """Mean per-step figures of one batch size over one round, in microseconds per request (forward: ms per step)."""

    batch: int
    steps: int
    schedule: float
    prepare: float
    sample: float
    update: float
    outputs: float
    front: float
    publish: float
    other: float
    host: float
    forward_ms: float
    step_ms: float
    overlapped: float = 0.0  # async scheduling: host work the forward hid (µs per request per step)
    wait_ms: float = 0.0  # async scheduling: the host waiting for the step's samples (ms per step)


def tiny_model_config() -> dict[str, Any]:
    """One layer, hidden 32: the forward is a few small matmuls, so the host's work dominates."""
    return one_layer_config()


def steady_engine(
    model_dir: Path, batch: int, steps: int, stop: list[str], overlap: bool = False
) -> LLMEngine:
    """An engine holding `batch` requests, stepped until every one of them decodes (no prefill left)."""
    total = PROMPT_TOKENS + steps + 64
    blocks = batch * -(-total // 16) + 16
    config = EngineConfig(
        model=str(model_dir),
        max_num_seqs=batch,
        max_num_batched_tokens=max(batch, 2048),
        num_kv_blocks=blocks,
        max_model_len=total + 16,
        async_scheduling="on" if overlap else "off",
    )
    engine = LLMEngine(config)
    engine.detokenize_in_front()  # as under the engine loop (engine/serving/boundary/worker.py), which a server runs
    rng = random.Random(0)
    params = SamplingParams(max_tokens=steps + 32, temperature=0.0, ignore_eos=True, stop=stop)
    for i in range(batch):
        engine.add_request(f"r{i}", [rng.randrange(32, 127) for _ in range(PROMPT_TOKENS)], params)
    for _ in range(64):
        engine.step_deltas()
        last = engine.traces[-1]
        if last.prefill_tokens == 0 and last.decode_tokens == batch:
            return engine
    raise RuntimeError("the batch never reached decode steady state")


class Probe:
    """One batch size's engine in decode steady state, with the front's routes for its requests."""

    def __init__(
        self, model_dir: Path, batch: int, steps: int, stop: list[str], overlap: bool = False
    ) -> None:
        self.batch = batch
        self.overlap = overlap
        self.engine = steady_engine(model_dir, batch, steps, stop, overlap)
        self.loop = asyncio.new_event_loop()
        self.routes = {}
        for request_id, request in self.engine.scheduler.requests.items():
            tokenizer = self.engine.tokenizer
            detokenizer = (
                None if text_in_loop(request.sampling) else tokenizer.detokenizer(request.prompt_token_ids)
            )
            self.routes[request_id] = OutputRoute(
                self.loop, lambda _: None, request.prompt_token_ids, detokenizer
            )

    def round(self, steps: int) -> Row:
        """Mean figures over `steps` steady decode steps (means: a GC pause or a slow step is part of the cost)."""
        walls, fronts, publishes, traces = [], [], [], []
        for i in range(steps):
            t0 = time.perf_counter()
            outputs = self.engine.step_deltas()
            t1 = time.perf_counter()
            # What the engine loop then does under ProcessEngine (engine/serving/boundary/worker.py _report, engine/serving/boundary/zmq_channel.py):
            # the stats snapshot and the encoded report, short of the socket send itself.
            _ENCODE(IterationReport(outputs, self.engine.stats(), [self.engine.traces[-1]]))
            t2 = time.perf_counter()
            for delta in outputs:  # what the front does with each output, on the consumer's event loop
                self.routes[delta.request_id].expand(delta)
            t3 = time.perf_counter()
            trace = self.engine.traces[-1]
            if trace.decode_tokens != self.batch or trace.prefill_tokens:
                raise RuntimeError(f"step {i} left steady state: {trace}")
            walls.append(t1 - t0)
            publishes.append(t2 - t1)
            fronts.append(t3 - t2)
            traces.append(trace)

        def per_request(values: list[float]) -> float:
            return statistics.fmean(values) * 1e6 / self.batch

        phases = {p: per_request([getattr(t, f"{p}_s") for t in traces]) for p in PHASES}
        other = per_request(
            [
                w - t.forward_s - sum(getattr(t, f"{p}_s") for p in PHASES)
                for w, t in zip(walls, traces, strict=True)
            ]
        )
        host = per_request([w - t.forward_s for w, t in zip(walls, traces, strict=True)])
        return Row(
            self.batch,
            steps,
            **phases,
            front=per_request(fronts),
            publish=per_request(publishes),
            other=other,
            host=host,
            forward_ms=statistics.fmean(t.forward_s for t in traces) * 1e3,
            step_ms=statistics.fmean(walls) * 1e3,
            overlapped=per_request([t.overlapped_s for t in traces]),
            wait_ms=statistics.fmean(t.wait_s for t in traces) * 1e3,
        )

    def close(self) -> None:
        """Release the trace file and the front's event loop."""
        self.engine.close()
        self.loop.close()


def measure(
    model_dir: Path, batches: list[int], steps: int, warmup: int, rounds: int, stop: list[str]
) -> list[Row]:
    """Per batch size, its best of `rounds` rounds (by host total); the rounds of all batch sizes interleave,
    so load from other work on a shared machine falls on every size alike."""
    probes = [Probe(model_dir, b, warmup + rounds * steps, stop) for b in batches]
    best: dict[int, Row] = {}
    try:
        for probe in probes:
            probe.round(warmup)
        for _ in range(rounds):
            for probe in probes:
                row = probe.round(steps)
                if probe.batch not in best or row.host < best[probe.batch].host:
                    best[probe.batch] = row
    finally:
        for probe in probes:
            probe.close()
    return [best[b] for b in batches]


def async_ab(
    model_dir: Path, batches: list[int], steps: int, warmup: int, rounds: int, stop: list[str]
) -> dict[int, dict[str, list[Row]]]:
    """Every batch size with async scheduling off and on, one engine each, their rounds alternated (off, on,
    off, on...) so load from other work falls on both alike; every round of each is kept."""
    probes = [
        Probe(model_dir, b, warmup + rounds * steps, stop, overlap)
        for b in batches
        for overlap in (False, True)
    ]
    rows: dict[int, dict[str, list[Row]]] = {b: {"off": [], "on": []} for b in batches}
    try:
        for probe in probes:
            probe.round(warmup)
        for _ in range(rounds):
            for probe in probes:
                rows[probe.batch]["on" if probe.overlap else "off"].append(probe.round(steps))
    finally:
        for probe in probes:
            probe.close()
    return rows


def async_markdown(rows: dict[int, dict[str, list[Row]]]) -> str:
    """The A/B table: step time off and on (medians of the rounds), their paired ratio, what the forward hid."""
    head = (
        "| batch | step ms, off | step ms, on | on/off (median of paired rounds) | forward ms | "
        "host hidden under the forward, µs/request | host waiting for samples, ms/step |"
    )
    lines = [head, "|---:" * 7 + "|"]
    for batch, by in rows.items():
        off, on = by["off"], by["on"]
        ratio = statistics.median(b.step_ms / a.step_ms for a, b in zip(off, on, strict=True))
        lines.append(
            f"| {batch} | {statistics.median(r.step_ms for r in off):.2f} | "
            f"{statistics.median(r.step_ms for r in on):.2f} | {ratio:.3f} | "
            f"{statistics.median(r.forward_ms for r in on):.2f} | "
            f"{statistics.median(r.overlapped for r in on):.2f} | {statistics.median(r.wait_ms for r in on):.2f} |"
        )
    return "\n".join(lines)


def markdown(rows: list[Row]) -> str:
    """The table for docs/engine.md and the README."""
    head = (
        "| batch | schedule | prepare | sample | update | outputs | other | **host total** | publish | front | "
        "forward ms/step | step ms |"
    )
    lines = [head, "|---:" * 12 + "|"]
    for r in rows:
        lines.append(
            f"| {r.batch} | {r.schedule:.2f} | {r.prepare:.2f} | {r.sample:.2f} | {r.update:.2f} | "
            f"{r.outputs:.2f} | {r.other:.2f} | **{r.host:.2f}** | {r.publish:.2f} | {r.front:.2f} | "
            f"{r.forward_ms:.2f} | {r.step_ms:.2f} |"
        )
    base = next((r for r in rows if r.batch == 64), None)
    top = max(rows, key=lambda r: r.batch)
    if base and top is not base:
        lines.append("")
        lines.append(
            f"host cost per request at batch {top.batch} / batch {base.batch}: {top.host / base.host:.2f}x"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", default="64,256,1024", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=20, help="steady decode steps per round and batch size")
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds; each batch size keeps its best"
    )
    parser.add_argument("--warmup", type=int, default=5, help="steady steps run before measuring")
    parser.add_argument("--stop", action="append", default=[], help="a stop string every request carries")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: steadier on a shared machine)"
    )
    parser.add_argument(
        "--async-ab",
        action="store_true",
        help="also compare step time with EngineConfig.async_scheduling off and on, rounds alternated",
    )
    parser.add_argument("--json", help="also write the raw figures here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory(prefix="host-overhead-") as tmp:
        model_dir = Path(tmp) / "tiny"
        write_seeded_llama(model_dir, tiny_model_config())
        batches = [int(b) for b in args.batches.split(",")]
        rows = measure(model_dir, batches, args.steps, args.warmup, args.rounds, args.stop)
        ab = (
            async_ab(model_dir, batches, args.steps, args.warmup, args.rounds, args.stop)
            if args.async_ab
            else {}
        )
    print(
        "host microseconds per request per step (mean over a round, best round); forward and step: ms per step"
    )
    print(markdown(rows))
    if ab:
        print(
            f"\nasync scheduling off / on, in-process LLMEngine, {args.rounds} alternated rounds of {args.steps} steps"
        )
        print(async_markdown(ab))
    if args.json:
        raw_ab = {b: {m: [r.__dict__ for r in rs] for m, rs in by.items()} for b, by in ab.items()}
        Path(args.json).write_text(
            json.dumps({"rows": [r.__dict__ for r in rows], "async_ab": raw_ab}, indent=2) + "\n"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
