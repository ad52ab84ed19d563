"""The simulator: the real `Scheduler` driven by a virtual clock and a cost model instead of a model.

Each iteration runs the engine's own path (schedule → execute → update): the scheduler builds its
batch exactly as in the engine; instead of a forward pass the clock advances by `a + b·batched tokens
+ c·context tokens` seconds and every sampling chunk "samples" a fixed non-stop token, so a request
ends by length (or deadline, or cancellation), unless its `stop_after` makes its token at that
position a stop token. With `async_scheduling` the `AsyncScheduler` runs and each step "executes"
while the next is scheduled, as in the engine, so the simulator drives both modes.
Work per iteration is O(batch): arrivals are fed from a sorted list, requests are built when they
arrive, and finished ones are reduced to a small record.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable, Mapping

from engine.core.async_scheduler import AsyncScheduler
from engine.core.kv_cache import BlockPool
from engine.core.policy import build_policy
from engine.core.request import Request, RequestMeta
from engine.core.sampling_params import SamplingParams
from engine.core.scheduler import Scheduler, SchedulerConfig, SchedulerOutput
from fairness.base import SchedulingPolicy
from sim.spec import Completion, CostModel, SimConfig, SimRequest, SimResult, SimulationError


class _AnyToken(dict[str, int]):
    """The 'sampled tokens' of a simulated iteration: every request samples token 1 (never a stop token)."""

    def __missing__(self, key: str) -> int:
        return 1

    def get(self, key: str, default: object = None) -> int:  # every key is present
        return self[key]


STOP_TOKEN = 2  # what a request with `stop_after` samples at that position


_SAMPLED, _NO_STOP = _AnyToken(), frozenset[int]()

__all__ = ["Completion", "CostModel", "SimConfig", "SimRequest", "SimResult", "SimulationError", "Simulator"]

IterationHook = Callable[["Simulator", SchedulerOutput], None]


class Simulator:
    """Runs a workload through a real Scheduler on a virtual clock."""

    def __init__(
        self, config: SimConfig | None = None, policy: SchedulingPolicy[Request] | None = None
    ) -> None:
        self.config = config = config or SimConfig()
        config.validate()
        self.pool = BlockPool(config.num_blocks, config.block_size, config.enable_prefix_caching)
        # The engine's own rule: the lift allowance scaled by what the charged step cost makes an answer.
        self.policy = (
            policy if policy is not None else build_policy(config.fairness, self.pool, config.step_cost)
        )
        self.scheduler = (AsyncScheduler if config.async_scheduling else Scheduler)(
            SchedulerConfig(
                max_num_batched_tokens=config.max_num_batched_tokens,
                max_num_seqs=config.max_num_seqs,
                max_model_len=config.max_model_len,
                watermark_blocks=config.watermark_blocks,
                preemption_mode=config.preemption_mode,
                request_batching=config.request_batching,
                step_cost=config.step_cost,
                charge_step_work=True,
            ),
            self.pool,
            self.policy,
            swap=self,
        )
        self._swapped: dict[str, int] = {}  # request id -> blocks held in the host buffer
        self._prompts: dict[int, list[int]] = {}
        self._specs: dict[str, SimRequest] = {}
        self._stops: dict[str, int] = {}  # request id -> the output position of its stop token
        self._in_flight: tuple[SchedulerOutput, Mapping[str, int]] | None = None  # async: the step "running"
        self.clock = 0.0
        self._idle = 0  # consecutive iterations that scheduled nothing
        self.on_complete: Callable[[Completion], None] | None = (
            None  # e.g. a cluster's outstanding-work count
        )

    # -- workload ---------------------------------------------------------------------------
    def make_request(self, spec: SimRequest) -> Request:
        """The engine Request for `spec` (prompts are shared placeholder lists; never mutated)."""
        if spec.prompt_tokens < 1 or spec.output_tokens < 1:
            raise SimulationError(f"request {spec.name!r}: prompt_tokens and output_tokens must be >= 1")
        prompt = self._prompts.get(spec.prompt_tokens)
        if prompt is None:
            prompt = self._prompts[spec.prompt_tokens] = [1] * spec.prompt_tokens
        meta = RequestMeta(
            tenant_id=spec.tenant,
            priority=spec.priority,
            weight=spec.weight,
            deadline=spec.deadline,
            arrival_time=spec.arrival,
            user=spec.user,
            workflow_run_id=spec.workflow_run_id,
        )
        stops = []
        if spec.stop_after is not None:
            self._stops[spec.name] = spec.stop_after
            stops = [STOP_TOKEN]
        params = SamplingParams(max_tokens=spec.output_tokens, ignore_eos=True, stop_token_ids=stops)
        return Request(spec.name, prompt, params, meta)

    def submit(self, spec: SimRequest) -> Request:
        """Queue `spec` now, from inside a run (an `on_iteration` hook): how closed-loop clients are simulated."""
        if spec.name in self._specs:
            raise SimulationError(f"duplicate request name {spec.name!r}")
        self._specs[spec.name] = spec
        request = self.make_request(spec)
        self.scheduler.add(request, self.clock)
        return request

    # -- the loop ---------------------------------------------------------------------------
    def run(
        self,
        workload: Iterable[SimRequest],
        until: float | None = None,
        max_iterations: int | None = None,
        service_every: float | None = None,
        track_service: bool = False,
        on_iteration: IterationHook | None = None,
    ) -> SimResult:
        """Simulate until every request ended, or until the clock passes `until`, or `max_iterations` ran.

        `service_every` samples charged service per tenant every that many simulated seconds;
        `track_service` keeps the maximum pairwise service difference, checked every iteration (O(tenants)).
        """
        specs = sorted(workload, key=lambda r: r.arrival)
        names = set()
        for spec in specs:
            if spec.name in names or spec.name in self._specs:
                raise SimulationError(f"duplicate request name {spec.name!r}")
            names.add(spec.name)
        result = SimResult()
        sched = self.scheduler
        # The loop makes no reference cycles; the collector's full passes over a large backlog would
        # otherwise make each iteration's cost grow with the number of waiting requests.
        gc_was_enabled = gc.isenabled()
        gc.disable()
        wall0 = time.perf_counter()
        self._idle = 0
        try:
            self._loop(specs, result, until, max_iterations, service_every, track_service, on_iteration)
        finally:
            result.wall_seconds = time.perf_counter() - wall0
            if gc_was_enabled:
                gc.enable()
        result.clock = self.clock
        result.preemptions = sched.preemptions_total
        result.swapped_bytes = sched.swapped_bytes_total
        result.recomputed_tokens = sched.recomputed_tokens_total
        result.deadline_misses = dict(sched.deadline_misses)
        result.deadline_wasted_tokens = sched.deadline_wasted_tokens
        result.block_waits = sched.block_waits_total
        return result

    def _loop(
        self,
        specs: list[SimRequest],
        result: SimResult,
        until: float | None,
        max_iterations: int | None,
        service_every: float | None,
        track_service: bool,
        on_iteration: IterationHook | None,
    ) -> None:
        sched = self.scheduler
        next_sample = self.clock if service_every else None
        i = 0
        while True:
            if i < len(specs) and specs[i].arrival <= self.clock:
                t0 = time.perf_counter()
                while i < len(specs) and specs[i].arrival <= self.clock:
                    spec = specs[i]
                    self._specs[spec.name] = spec
                    sched.add(self.make_request(spec), self.clock)
                    i += 1
                result.intake_seconds += time.perf_counter() - t0
            if not sched.has_unfinished() and self._in_flight is None:
                if i == len(specs):
                    break
                self.clock = specs[i].arrival
                continue
            if (until is not None and self.clock >= until) or (
                max_iterations is not None and result.iterations >= max_iterations
            ):
                break
            out = self.step(result)
            if track_service:
                values = self.policy.service().values()
                if len(values) > 1:
                    result.max_service_difference = max(
                        result.max_service_difference, max(values) - min(values)
                    )
            if next_sample is not None and service_every and self.clock >= next_sample:
                result.service_samples.append((self.clock, dict(self.policy.service())))
                next_sample += service_every * max(1, int((self.clock - next_sample) // service_every) + 1)
            if on_iteration is not None:
                on_iteration(self, out)

    def step(self, result: SimResult) -> SchedulerOutput:
        """One iteration at `self.clock`: schedule, execute (advance the clock by the cost model), update,
        record; returns the step scheduled. With async scheduling the step executed is the one before.

        Public so that a cluster of simulators (sim/cluster.py) can interleave engines on one clock.
        """
        sched = self.scheduler
        scheduled = sched.schedule(self.clock)
        self._idle = 0 if scheduled.chunks or self._in_flight else self._idle + 1
        if self._idle > self.config.max_idle_iterations:
            raise SimulationError(
                f"stalled: {sched.num_waiting} requests wait but nothing can run "
                f"(num_blocks={self.config.num_blocks} too small?)"
            )
        ran, sampled = self._execute(scheduled)
        finished = sched.update(ran, sampled, _NO_STOP, now=self.clock)
        result.iterations += 1
        result.request_iterations += len(ran.chunks)
        result.batched_tokens += ran.prefill_tokens + ran.decode_tokens
        for request in scheduled.finished:
            self._complete(request, result)
        for request in finished:
            self._complete(request, result)
        return scheduled

    def _execute(self, scheduled: SchedulerOutput) -> tuple[SchedulerOutput, Mapping[str, int]]:
        """The step whose samples are in hand now (`scheduled`, or with async scheduling the one before),
        its samples, and the clock moved past its forward."""
        sampled = self._samples(scheduled)
        if self.config.async_scheduling:
            ran, self._in_flight = self._in_flight, (scheduled, sampled) if scheduled.chunks else None
            if ran is None:
                return SchedulerOutput(scheduled.iteration), _SAMPLED
            scheduled, sampled = ran
        context = 0
        for c in scheduled.chunks:
            context += c.start + c.length
        self.clock += self.config.cost.seconds(scheduled.prefill_tokens + scheduled.decode_tokens, context)
        return scheduled, sampled

    def _samples(self, out: SchedulerOutput) -> Mapping[str, int]:
        """Token 1 for every sampling chunk, the stop token where a request's `stop_after` says."""
        if not self._stops:
            return _SAMPLED
        sampled = _AnyToken()
        for c in out.chunks:
            stop_at = self._stops.get(c.request.request_id)
            if (
                stop_at is not None
                and c.samples
                and c.start + c.length - c.request.num_prompt_tokens + 1 == stop_at
            ):
                sampled[c.request.request_id] = STOP_TOKEN
        return sampled

    def service(self) -> Mapping[str, float]:
        """Charged service by fairness key so far."""
        return self.policy.service()

    def _complete(self, request: Request, result: SimResult) -> None:
        spec = self._specs.pop(request.request_id)
        self._stops.pop(request.request_id, None)
        self._swapped.pop(request.request_id, None)
        assert request.finish_reason is not None and request.finished_time is not None
        result.output_tokens += len(request.output_token_ids)
        done = result.completions[spec.name] = Completion(
            spec.name,
            spec.tenant,
            spec.arrival,
            request.first_scheduled_time,
            request.first_token_time,
            request.finished_time,
            request.finish_reason,
            len(request.output_token_ids),
            len(request.preemptions),
            request.recomputed_tokens,
            request.charged_service,
        )
        if self.on_complete is not None:
            self.on_complete(done)

    # -- swap preemption against a bounded host buffer ---------------------------------------
    def swap_out(self, request: Request) -> int:
        """Hold the request's blocks in the host buffer; the bytes moved, or -1 when it is full."""
        blocks = -(-request.num_computed_tokens // self.config.block_size)
        if sum(self._swapped.values()) + blocks > self.config.swap_space_blocks:
            return -1  # buffer full: the scheduler falls back to recompute
        self._swapped[request.request_id] = blocks
        return blocks * self.config.bytes_per_block

    def swap_in(self, request: Request) -> int:
        """Give the request's blocks back from the host buffer; the bytes moved."""
        return self._swapped.pop(request.request_id, 0) * self.config.bytes_per_block
