"""What the engine says about itself: one `IterationTrace` per step (a ring for the front, optionally a file)
and the `EngineStats` snapshot the gateway routes, admits and reports by.

Kept apart from `LLMEngine` so the engine file holds the step path only; the rates here are EWMAs over
iterations that ran something, so an idle engine keeps its last observed speed (feasibility uses it)."""

from __future__ import annotations

import time
from collections import deque
from typing import Any

from engine.core.kv_cache import BlockPool
from engine.core.outputs import EngineStats
from engine.core.request import RequestState
from engine.core.scheduler import Scheduler, SchedulerOutput
from engine.core.trace import IterationTrace, TraceWriter
from engine.serving.counter_sync import CounterSync
from fairness.base import SchedulingPolicy

_EWMA = 0.2


def _ewma(old: float, new: float) -> float:
    return new if not old else (1 - _EWMA) * old + _EWMA * new


class EngineRecorder:
    """Iteration traces and the running rates behind `EngineStats`."""

    def __init__(
        self,
        scheduler: Scheduler,
        pool: BlockPool,
        trace_path: str | None,
        max_num_batched_tokens: int,
        max_num_seqs: int,
    ) -> None:
        self.scheduler = scheduler
        self.pool = pool
        self.traces: deque[IterationTrace] = deque(maxlen=512)
        self._writer = TraceWriter(trace_path) if trace_path else None
        self._rates = EngineStats(
            kv_blocks_total=pool.num_blocks,
            max_num_batched_tokens=max_num_batched_tokens,
            max_num_seqs=max_num_seqs,
        )
        # Seconds each tenant has had a request waiting, and who was waiting at the last snapshot: the time
        # since then is theirs (wall time, so the loop's own gaps count as the queue's, as a client feels it).
        self._backlogged_s: dict[str, float] = {}
        self._waiting_at: tuple[float, frozenset[str]] = (time.monotonic(), frozenset())

    def record(self, out: SchedulerOutput, seconds: float, completions: int) -> IterationTrace:
        """The trace row of one step (kept in the ring) and its contribution to the rates."""
        sched = self.scheduler
        trace = IterationTrace(
            iteration=out.iteration,
            time=time.time(),
            waiting=sched.num_waiting,
            running=len(sched.running),
            prefill_tokens=out.prefill_tokens,
            decode_tokens=out.decode_tokens,
            kv_blocks_used=self.pool.num_used,
            kv_blocks_free=self.pool.num_free,
            preemptions=len(out.preempted),
            completions=completions,
            seconds=seconds,
            cached_tokens=out.cached_tokens,
            waiting_for_blocks=sched.waiting_for_blocks,
        )
        self.traces.append(trace)
        s = self._rates
        if out.chunks and seconds > 0:
            s.iteration_seconds = seconds if s.iterations == 0 else _ewma(s.iteration_seconds, seconds)
            if out.prefill_tokens:
                s.prefill_tokens_per_s = _ewma(s.prefill_tokens_per_s, out.prefill_tokens / seconds)
            if out.decode_tokens:
                s.decode_tokens_per_s = _ewma(s.decode_tokens_per_s, out.decode_tokens / seconds)
        s.batch_size = len(out.chunks)
        s.iterations = out.iteration
        return trace

    def write(self, trace: IterationTrace) -> None:
        """Append a finished trace row to the trace file, if one is configured."""
        if self._writer:
            self._writer.write(trace)

    def snapshot(self, policy: SchedulingPolicy[Any], counter_sync: CounterSync | None) -> EngineStats:
        """A fresh snapshot of queue, memory and rate figures."""
        s, sched = self._rates, self.scheduler
        waiting_by: dict[str, int] = {}
        running_by: dict[str, int] = {}
        waiting_tokens = 0
        for r in sched.requests.values():
            if r.state is RequestState.RUNNING:
                running_by[r.meta.tenant_id] = running_by.get(r.meta.tenant_id, 0) + 1
            else:
                waiting_by[r.meta.tenant_id] = waiting_by.get(r.meta.tenant_id, 0) + 1
                waiting_tokens += r.num_tokens - r.num_computed_tokens
        self._count_backlog(frozenset(waiting_by))
        weights = getattr(policy, "weights", None)  # FCFS has none
        sync: dict[str, Any] = {}
        if counter_sync is not None:
            state, age, engines = counter_sync.status()
            sync = {"counter_sync": state, "counter_sync_age_s": age, "counter_sync_engines": engines}
        return EngineStats(
            alive=True,
            waiting=sched.num_waiting,
            running=len(sched.running),
            waiting_by_tenant=waiting_by,
            running_by_tenant=running_by,
            waiting_tokens=waiting_tokens,
            kv_blocks_used=self.pool.num_used,
            kv_blocks_total=self.pool.num_blocks,
            batch_size=s.batch_size,
            prefill_tokens_per_s=s.prefill_tokens_per_s,
            decode_tokens_per_s=s.decode_tokens_per_s,
            iteration_seconds=s.iteration_seconds,
            max_num_batched_tokens=s.max_num_batched_tokens,
            max_num_seqs=s.max_num_seqs,
            preemptions_total=sched.preemptions_total,
            preemptions_by_kind={f"{r}/{m}": n for (r, m), n in sched.preemptions_by_kind.items()},
            recomputed_tokens_total=sched.recomputed_tokens_total,
            swapped_bytes_total=sched.swapped_bytes_total,
            kv_alloc_failures=self.pool.alloc_failures,
            deadline_misses=sum(sched.deadline_misses.values()),
            waiting_for_blocks=sched.waiting_for_blocks,
            service=dict(policy.service()),
            weights=dict(weights()) if weights is not None else {},
            backlogged_s=dict(self._backlogged_s),
            iterations=s.iterations,
            **sync,
        )

    def _count_backlog(self, waiting: frozenset[str]) -> None:
        """Charge the time since the last snapshot to the tenants that were waiting then."""
        now = time.monotonic()
        since, was_waiting = self._waiting_at
        for tenant in was_waiting:
            self._backlogged_s[tenant] = self._backlogged_s.get(tenant, 0.0) + (now - since)
        self._waiting_at = (now, waiting)

    def close(self) -> None:
        """Release the trace file."""
        if self._writer:
            self._writer.close()
