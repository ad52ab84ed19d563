"""The forward thread of async scheduling: one step's forward in flight while the host schedules the next.

`execute(N+1)` hands N+1's host-built inputs to the thread and returns N's samples, so the host work of
landing N, its outputs and scheduling N+1 runs beside N's forward (engine/core/async_scheduler.py says why
the tokens and charges are still the plain loop's). Forwards run one at a time on one thread, so a KV
block freed while N runs and reused by N+1 is written by N first; swapping (host copies of blocks)
waits for the forward in flight (`wait_forward`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from time import perf_counter

import torch

from engine.core.kv_cache import BlockPool
from engine.core.scheduler import SchedulerOutput
from engine.core.token_logprobs import TokenLogprobs
from engine.worker.executor import Ran, without_failures
from engine.worker.host_batch import HostBatch
from engine.worker.model_runner import ModelRunner, RunnerTiming


@dataclass
class _Sampled:
    """What the forward thread hands back for one step."""

    sampled: dict[str, int]
    failures: dict[str, Exception]
    timing: RunnerTiming
    began: float  # perf_counter on the forward thread
    ended: float
    logprobs: dict[str, TokenLogprobs]


@dataclass
class _Flight:
    """A step on the forward thread."""

    out: SchedulerOutput
    started: float
    future: Future[_Sampled]


class OverlapExecutor:
    """Keeps one step's forward in flight on a thread of its own; `execute` returns the step before."""

    def __init__(self, runner: ModelRunner, pool: BlockPool) -> None:
        self.runner = runner
        self.pool = pool
        # A new thread starts with torch's default thread count: give it the engine's.
        self._thread = ThreadPoolExecutor(
            1, "fairserve-forward", initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),)
        )
        self._flight: _Flight | None = None
        self._forgotten: list[str] = []  # ended requests whose sampler state waits for the forward in flight
        self._landed_at = 0.0  # perf_counter when the host last stopped waiting for a forward

    @property
    def in_flight(self) -> bool:
        """True while a step's samples have not been returned."""
        return self._flight is not None

    def execute(self, out: SchedulerOutput, started: float) -> Ran:
        """Put `out` on the forward thread (when it has work) and return the step that was in flight, or
        an empty step when none was."""
        ready, self._forgotten = self._forgotten, []
        p0 = perf_counter()
        current, self._flight = self._flight, None
        if out.chunks:
            block_ids = self.pool.block_ids
            batch = self.runner.prepare_host(
                out, {c.request.request_id: block_ids(c.request.request_id) for c in out.chunks}
            )
            self._flight = _Flight(out, started, self._thread.submit(self._run, batch))
        p1 = perf_counter()
        if current is None:
            self._forget(ready)
            return Ran(SchedulerOutput(out.iteration), {}, {}, started, started, prepare_s=p1 - p0)
        done = current.future.result()
        p2 = perf_counter()
        self._forget(ready)
        # Host work that ran beside this step's forward: the previous step's landing and outputs, whatever
        # the caller did with them (a worker publishes them), the next step's schedule and inputs.
        overlapped = max(0.0, min(p1, done.ended) - max(done.began, self._landed_at))
        self._landed_at = p2
        sampled = without_failures(done.sampled, done.failures)
        return Ran(
            current.out,
            sampled,
            done.failures,
            current.started,
            time.time(),
            done.timing,
            p1 - p0,
            p2 - p1,
            overlapped,
            done.logprobs,
        )

    def _run(self, batch: HostBatch) -> _Sampled:
        """On the forward thread: forward and sampling; the failures are taken here, with their step."""
        runner = self.runner
        began = perf_counter()
        sampled = runner.run(batch)
        failures = runner.sampler.failures.take()
        return _Sampled(sampled, failures, runner.timing, began, perf_counter(), runner.sampler.last_logprobs)

    def forget(self, request_id: str) -> None:
        """Drop an ended request's sampler state once no forward in flight can still sample it."""
        self._forgotten.append(request_id)

    def wait_forward(self) -> None:
        """Block until the forward in flight has run (before the host copies KV blocks: swapping)."""
        if self._flight is not None:
            wait([self._flight.future])

    def close(self) -> None:
        """Let the forward in flight finish and stop the thread."""
        self._thread.shutdown(wait=True)

    def _forget(self, request_ids: list[str]) -> None:
        forget = self.runner.sampler.forget
        for request_id in request_ids:
            forget(request_id)
