"""Async scheduling: schedule and prepare step N+1 on the host while step N's forward runs, as vLLM V1 does.

    iterate():   schedule N+1 as if every request N samples already had its token   | forward and sampling
                 prepare N+1's inputs on the host, hand them to the forward thread   | of N, then of N+1,
                 wait for N's samples; land them (token-level stops), N's outputs     | on one thread
                 commit N+1: drop what requests N ended had in it, charge the rest

Why the outputs and the charges are those of the plain loop:
- N+1's schedule sees each request that N samples as already holding that token: the last output id is a
  placeholder, -(1 + its row among N's samples), and its computed count is N's end. The forward thread
  puts N's sampled id in its place (ModelRunner._to_device), from the ids where they were sampled, so
  the host never waits for it and never copies it through a Python list.
- A request that N ends (EOS, a stop token or string, max_tokens, its sampler failing) had a decode in
  N+1. That token is computed and thrown away, and never charged: N+1's decodes of requests in flight
  are `provisional` (engine/scheduler_output.py) and charged only here, for the requests that go on.
  Requests that their token in flight ends by length are not scheduled at all.
- An abort or a deadline applied by N+1's schedule ends a request whose token is in flight: that token
  still lands and goes out with the final output (the plain loop sent it one step earlier).
- Forwards run one at a time on one thread, so a KV block freed while N runs and reused by N+1 is written
  by N first; swapping (host copies of blocks, on this thread) waits for the forward in flight.
What differs is timing: N+1 is scheduled before N's finished requests free their seats and blocks, so
admissions and preemptions can come a step later, and victims and admission order read counters that
do not yet hold the provisional decodes.
"""

from __future__ import annotations

import time
from collections.abc import Container
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING

import torch

from engine.model_runner import HostBatch, RunnerTiming
from engine.request import Request
from engine.scheduler import Scheduler, SchedulerOutput

if TYPE_CHECKING:
    from engine.llm_engine import Emitted, LLMEngine


@dataclass
class _Ran:
    """What the forward thread hands back for one step."""

    sampled: dict[str, int]
    failures: dict[str, Exception]
    timing: RunnerTiming
    began: float  # perf_counter on the forward thread
    ended: float


@dataclass
class _Flight:
    """One scheduled step: its batch, and its forward (None when it had nothing to run)."""

    out: SchedulerOutput
    batch: HostBatch | None
    future: Future[_Ran] | None
    started: float  # epoch seconds it was scheduled (the cancel bookkeeping's window)
    schedule_s: float
    prepare_s: float


class OverlapStepper:
    """Drives one LLMEngine's iterations with a step always in flight on a forward thread of its own."""

    def __init__(self, engine: LLMEngine) -> None:
        self.engine = engine
        # A new thread starts with torch's default thread count: give it the engine's.
        self._thread = ThreadPoolExecutor(
            1, "fairserve-forward", initializer=torch.set_num_threads, initargs=(torch.get_num_threads(),)
        )
        self._flight: _Flight | None = None
        self._forgotten: list[str] = []  # ended requests whose sampler state waits for the forward in flight
        self._landed_at = 0.0  # perf_counter when the host last stopped waiting for a forward

    @property
    def in_flight(self) -> bool:
        """True while a step's results have not landed."""
        return self._flight is not None

    def forget_later(self, request_id: str) -> None:
        """Drop an ended request's sampler state once no forward in flight can still sample it."""
        self._forgotten.append(request_id)

    def wait_forward(self) -> None:
        """Block until the forward in flight has run (before the host copies KV blocks: swapping)."""
        if self._flight is not None and self._flight.future is not None:
            wait([self._flight.future])

    def close(self) -> None:
        """Let the forward in flight finish and stop the thread."""
        self._thread.shutdown(wait=True)

    def iterate(self) -> list[Emitted]:
        """Land one step (scheduling the next one first); what each request has new to report."""
        engine = self.engine
        ready, self._forgotten = self._forgotten, []
        current = self._flight
        retired: list[Request] = []
        if current is None:  # nothing in flight: start one, then go on as usual
            current = self._launch()
            if current.future is None:  # nothing to run (waiting, or only retirements): as without overlap
                self._forget(ready)
                outputs = engine.collect_outputs(current.out.finished)
                trace = engine.record_trace(current.out, 0.0, len(current.out.finished))
                trace.schedule_s = current.schedule_s
                engine.write_trace(trace)
                return outputs
            self._commit(current)
            retired = current.out.finished
        nxt = self._launch()
        w0 = perf_counter()
        assert current.future is not None and current.batch is not None
        ran = current.future.result()
        w1 = perf_counter()
        self._forget(ready)
        t1 = time.time()
        engine.fail_requests(ran.failures, t1)
        engine.note_ran(current.out, current.started, t1)
        finished = land(
            engine.scheduler, current.batch.sampling, ran.sampled, engine.eos_token_ids, t1, ran.failures
        )
        p1 = perf_counter()
        touched = retired + nxt.out.finished + [c.request for c in current.out.chunks]
        outputs = engine.collect_outputs(touched)
        p2 = perf_counter()
        discarded = self._commit(nxt) if nxt.future is not None else 0
        self._flight = nxt if nxt.future is not None else None
        p3 = perf_counter()
        trace = engine.record_trace(
            current.out, t1 - current.started, len(finished) + len(retired) + len(nxt.out.finished)
        )
        trace.schedule_s, trace.prepare_s = nxt.schedule_s, nxt.prepare_s
        trace.forward_s, trace.sample_s = ran.timing.forward_s, ran.timing.sample_s
        trace.update_s, trace.outputs_s = (p1 - w1) + (p3 - p2), p2 - p1
        trace.wait_s, trace.discarded_tokens = w1 - w0, discarded
        # Host work that ran beside this step's forward and sampling: the previous step's landing and outputs,
        # whatever the caller did with them (a worker publishes them), the next step's schedule and inputs.
        trace.overlapped_s = max(0.0, min(w0, ran.ended) - max(ran.began, self._landed_at))
        self._landed_at = w1
        engine.write_trace(trace)
        return outputs

    def _launch(self) -> _Flight:
        """Schedule the next step and hand its host-built inputs to the forward thread."""
        engine = self.engine
        t0, p0 = time.time(), perf_counter()
        out = engine.scheduler.schedule(t0)
        p1 = perf_counter()
        if not out.chunks:
            return _Flight(out, None, None, t0, p1 - p0, 0.0)
        block_ids = engine.pool.block_ids
        batch = engine.runner.prepare_host(
            out, {c.request.request_id: block_ids(c.request.request_id) for c in out.chunks}
        )
        future = self._thread.submit(self._run, batch)
        return _Flight(out, batch, future, t0, p1 - p0, perf_counter() - p1)

    def _run(self, batch: HostBatch) -> _Ran:
        """On the forward thread: forward and sampling; the failures are taken here, with their step."""
        runner = self.engine.runner
        began = perf_counter()
        sampled = runner.run(batch)
        return _Ran(sampled, runner.sampler.failures.take(), runner.timing, began, perf_counter())

    def _commit(self, flight: _Flight) -> int:
        """The step's results are now certain to be wanted for the requests still live: charge their provisional
        decodes, advance them, and put a placeholder where each one's sampled token will land. Returns the
        tokens thrown away (requests that ended before this step's results)."""
        out, sched = flight.out, self.engine.scheduler
        survivors = [r for r in out.provisional if not r.is_finished]
        if survivors:
            cost = sched.policy.charge_decodes(survivors)
            for request in survivors:
                request.charged_service += cost
        pool = sched.pool
        caching, block_size = pool.enable_prefix_caching, pool.block_size
        discarded = 0
        for chunk in out.chunks:
            request = chunk.request
            if request.is_finished:
                discarded += chunk.length
                continue
            computed = request.num_computed_tokens = chunk.start + chunk.length
            if caching and (chunk.length > 1 or computed % block_size == 0):
                pool.commit_full_blocks(
                    request.request_id, request.all_token_ids, computed, request.prefix_root
                )
        assert flight.batch is not None
        for row, request in enumerate(flight.batch.sampling):
            if not request.is_finished:
                request.output_token_ids.append(-1 - row)
                request.num_output_placeholders = 1
        out.decode_tokens -= discarded
        return discarded

    def _forget(self, request_ids: list[str]) -> None:
        forget = self.engine.runner.sampler.forget
        for request_id in request_ids:
            forget(request_id)


def land(
    sched: Scheduler,
    sampling: list[Request],
    sampled: dict[str, int],
    eos_token_ids: set[int] | frozenset[int],
    now: float,
    failed: Container[str] = (),
) -> list[Request]:
    """Put each sampled token in its placeholder and apply the token-level stops; returns the requests that ended.
    A request without a placeholder had ended before its step ran: its token is thrown away."""
    finished: list[Request] = []
    max_model_len = sched.config.max_model_len
    for request in sampling:
        if not request.num_output_placeholders:
            continue
        output = request.output_token_ids
        request.num_output_placeholders = 0
        if request.request_id in failed:
            output.pop()  # its own sampling raised: it ended with no token, as without overlap
            continue
        token = output[-1] = sampled[request.request_id]
        if request.first_token_time is None:
            request.first_token_time = now
        if request.is_finished:
            continue  # ended by an abort or its deadline while its token was in flight: the token still goes out
        params = request.sampling
        if (
            len(output) >= params.max_tokens
            or request.num_tokens >= max_model_len
            or (token in eos_token_ids and not params.ignore_eos)
            or token in params.stop_token_ids
        ):
            reason = sched.stop_reason(request, token, eos_token_ids)
            if reason is not None:
                sched.finish(request, reason, now)
                finished.append(request)
    return finished
