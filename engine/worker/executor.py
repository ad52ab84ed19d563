"""Running a scheduled step on the model: inline, or (engine/worker/overlap.py) on a forward thread one step behind.

Both hand the engine loop a `Ran`, the step whose samples are in hand: the one just scheduled when
inline, the one before it when overlapped. The loop is the same either way (engine/serving/llm_engine.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from time import perf_counter

from engine.core.kv_cache import BlockPool
from engine.core.scheduler import SchedulerOutput
from engine.core.token_logprobs import TokenLogprobs
from engine.worker.model_runner import ModelRunner, RunnerTiming


@dataclass
class Ran:
    """A step whose forward and sampling are done."""

    out: SchedulerOutput
    sampled: dict[str, int]  # request id -> token; a request whose sampling raised is missing
    failures: dict[str, Exception]
    started: float  # epoch seconds it was scheduled (the cancel bookkeeping's window)
    ended: float  # epoch seconds its samples were in hand
    timing: RunnerTiming = field(default_factory=RunnerTiming)
    prepare_s: float = 0.0  # host work building the batch submitted by this call
    wait_s: float = 0.0  # how long the host waited for the samples (overlapped only)
    overlapped_s: float = 0.0  # host work its forward hid (overlapped only)
    logprobs: dict[str, TokenLogprobs] = field(default_factory=dict)  # of the requests that asked for them


def without_failures(sampled: dict[str, int], failures: dict[str, Exception]) -> dict[str, int]:
    """`sampled` less the requests whose own sampling raised."""
    if not failures:
        return sampled
    return {rid: token for rid, token in sampled.items() if rid not in failures}


def land_logprobs(ran: Ran) -> None:
    """Keep each sampled token's logprobs with its request, in step with its output ids: after `update`
    the step's token is its request's last (async scheduling adds the next placeholder only later)."""
    logprobs = ran.logprobs
    for chunk in ran.out.chunks:
        request = chunk.request
        found = logprobs.get(request.request_id)
        if found is not None and len(request.output_logprobs) < len(request.output_token_ids):
            request.output_logprobs.append(found)


class InlineExecutor:
    """Runs each step to its samples before returning."""

    in_flight = False

    def __init__(self, runner: ModelRunner, pool: BlockPool) -> None:
        self.runner = runner
        self.pool = pool

    def execute(self, out: SchedulerOutput, started: float) -> Ran:
        """Run `out` now."""
        runner, block_ids = self.runner, self.pool.block_ids
        p0 = perf_counter()
        sampled = runner.execute(
            out, {c.request.request_id: block_ids(c.request.request_id) for c in out.chunks}
        )
        p1 = perf_counter()
        failures = runner.sampler.failures.take()
        timing = runner.timing
        prepare_s = (p1 - p0) - timing.forward_s - timing.sample_s  # block tables and inputs
        ran = Ran(out, without_failures(sampled, failures), failures, started, time.time(), timing, prepare_s)
        ran.logprobs = runner.sampler.last_logprobs
        return ran

    def forget(self, request_id: str) -> None:
        """A request ended: drop its sampler state."""
        self.runner.sampler.forget(request_id)

    def wait_forward(self) -> None:
        """Nothing runs between calls."""

    def close(self) -> None:
        """Nothing to stop."""
